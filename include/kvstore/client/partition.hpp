// Which server holds which elements of a key. Every worker computes the same answer from the
// key's id, size, row length and partition, so no lookup service is needed. hashed (the
// default): a small value lives whole on one server (chosen by a hash of the key), a big one is
// sliced evenly over all servers (whole rows for a matrix). even: BigDL's chunks, chunk i on
// server i whatever the size.
#pragma once

#include <algorithm>
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

/// BigDL's chunk i of n units over `parts`: start i*floor(n/parts) + min(i, n mod parts), length
/// floor(n/parts) + (i < n mod parts). The first n mod parts chunks are one unit longer.
struct chunk {
  std::uint64_t start = 0, length = 0;
};
inline chunk even_chunk(std::uint64_t i, std::uint64_t parts, std::uint64_t n) {
  const std::uint64_t base = n / parts, extra = n % parts;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

/// partition::even: chunk i of the key's units (rows for a matrix) on server i; empty chunks
/// (fewer units than servers) hold nothing and get no slice.
inline std::vector<slice_ref> partition_even(std::uint64_t total, std::uint64_t row_length,
                                             int servers) {
  const std::uint64_t unit = row_length ? row_length : 1;
  const auto s = static_cast<std::uint64_t>(servers);
  std::vector<slice_ref> out;
  for (std::uint64_t i = 0; i < s; ++i) {
    const chunk c = even_chunk(i, s, total / unit);
    if (c.length) out.push_back({static_cast<int>(i), c.start * unit, (c.start + c.length) * unit});
  }
  return out;
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
