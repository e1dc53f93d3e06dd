// Which server holds which elements of a key. Every worker computes the same answer from the
// key's id, size and row length, so no lookup service is needed: a small value lives whole on
// one server (chosen by a hash of the key), a big one is sliced evenly over all servers (whole
// rows for a matrix).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvstore::detail {

struct slice_ref {
  int server = 0;
  std::uint64_t lo = 0, hi = 0;  // elements [lo, hi) of the key
};

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::vector<slice_ref> partition(std::uint64_t key_id, std::uint64_t total,
                                        std::uint64_t row_length, std::size_t elem_size,
                                        int servers, std::size_t slice_bytes) {
  std::vector<slice_ref> out;
  const int home = static_cast<int>(mix64(key_id) % static_cast<std::uint64_t>(servers));
  const std::uint64_t unit = row_length ? row_length : 1;
  const std::uint64_t units = total / unit;
  if (servers == 1 || total * elem_size <= slice_bytes || units < 2) {
    out.push_back({home, 0, total});
    return out;
  }
  const auto s = static_cast<std::uint64_t>(servers);
  for (std::uint64_t i = 0; i < s; ++i) {
    const std::uint64_t ulo = units * i / s, uhi = units * (i + 1) / s;
    if (uhi == ulo) continue;
    // Rotate by the key's home so the first slices of many keys do not all land on server 0.
    out.push_back(
        {static_cast<int>((static_cast<std::uint64_t>(home) + i) % s), ulo * unit, uhi * unit});
  }
  return out;
}

}  // namespace kvstore::detail
