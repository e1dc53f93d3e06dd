// How a batch of small keys is cut into batched frames (issue 12): the keys grouped by server
// with a counting sort (linear in the keys), each server's keys in frames of at most chunk_bytes
// of entries and values and at most batch_frame_keys keys (at least one key each). The cut
// depends on nothing but each key's server and size, so a planned call (client/call_plan.hpp)
// cuts its batches once, when it is planned, and every call that follows the plan sends its
// frames from that cut (client/batch.hpp) instead of sorting its keys again.
#pragma once

#include <kvstore/wire/messages.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvstore::detail {

/// A batched frame names at most this many keys (and holds at most chunk_bytes). A server
/// passes over a frame's slices twice (checks every key, then applies or copies), each key a few
/// cache lines of slice and value: over 4,096 keys (about 1.3 MB) the second pass still finds
/// them in its core's cache, where over the ~37,000 single-float keys of a 1 MiB frame it read
/// them all from memory again.
inline constexpr std::size_t batch_frame_keys = 4096;

/// A batch's keys by server, cut into frames.
struct batch_frames {
  /// Keys [lo, hi) of `order` go to `server` in one frame, with `elements` values together.
  struct frame {
    int server = 0;
    std::size_t lo = 0, hi = 0;
    std::uint64_t elements = 0;
    std::size_t keys() const noexcept { return hi - lo; }
  };
  std::vector<std::uint32_t> order;  // the batch's keys by server (indices into its entries)
  std::vector<frame> frames;
};

/// The cut of `entries` (each with `server`, in [0, servers), and `total`, its elements) into
/// frames of at most `chunk_bytes` of entries and values of `elem_bytes` each.
template <class Entry>
batch_frames cut_frames(std::span<const Entry> entries, std::size_t servers,
                        std::size_t chunk_bytes, std::size_t elem_bytes) {
  std::vector<std::size_t> start(servers + 1, 0);
  for (const auto& e : entries) ++start[static_cast<std::size_t>(e.server) + 1];
  for (std::size_t s = 0; s < servers; ++s) start[s + 1] += start[s];
  batch_frames p;
  p.order.resize(entries.size());
  std::vector<std::size_t> at(start.begin(), start.end() - 1);
  for (std::size_t j = 0; j < entries.size(); ++j)
    p.order[at[static_cast<std::size_t>(entries[j].server)]++] = static_cast<std::uint32_t>(j);
  for (std::size_t s = 0; s < servers; ++s) {
    batch_frames::frame fr{static_cast<int>(s), start[s], start[s], 0};
    std::size_t bytes = 0;
    for (std::size_t k = start[s]; k < start[s + 1]; ++k) {
      const std::uint64_t n = entries[p.order[k]].total;
      const std::size_t add = wire::batch_entry_size + n * elem_bytes;
      if (k > fr.lo && (bytes + add > chunk_bytes || k - fr.lo == batch_frame_keys)) {
        fr.hi = k;
        p.frames.push_back(fr);
        fr = {static_cast<int>(s), k, k, 0};
        bytes = 0;
      }
      bytes += add;
      fr.elements += n;
    }
    fr.hi = start[s + 1];
    if (fr.hi > fr.lo) p.frames.push_back(fr);
  }
  return p;
}

}  // namespace kvstore::detail
