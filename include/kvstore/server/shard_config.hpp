// What a shard needs to know of the job: the server fills it from dist_options.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace kvstore::detail {

/// What a shard needs to know of the job (the server fills it from dist_options).
struct shard_config {
  bool sync = true;  ///< dist_sync rounds, or dist_async
  int num_workers = 1;
  std::size_t chunk_bytes = std::size_t{1} << 20;        ///< a pull is answered in frames of this
  std::size_t max_frame_bytes = std::size_t{1} << 30;    ///< an init frame carries at most this
  std::uint64_t max_key_bytes = std::uint64_t{8} << 30;  ///< bytes of one key slice at most
  /// Bytes of all slices together (each also counts shard::key_overhead_bytes); 0: no bound.
  std::uint64_t max_total_bytes = 0;
  std::uint64_t max_keys = std::uint64_t{1} << 24;  ///< slices this shard holds at most

  // Versions and bounded staleness: pulls held until they may be answered.
  /// dist_async: a pull waits until every worker still in the group pushed the key at least
  /// (the puller's pushes of it) - staleness times; nullopt: unbounded (no wait).
  std::optional<std::uint64_t> staleness;
  std::size_t max_held_pulls = 4096;                       ///< held pulls of one worker at most
  std::uint64_t max_held_bytes = std::uint64_t{64} << 20;  ///< and their bytes (row lists)
  std::chrono::milliseconds hold_timeout{120'000};         ///< a held pull fails after this
  /// Threads that apply an element-wise optimizer to a large value together, the io thread
  /// included (server/apply_pool.hpp); 0: the number of cores, 1: the io thread alone.
  unsigned apply_threads = 1;
};

}  // namespace kvstore::detail
