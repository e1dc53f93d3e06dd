// What a worker knows of one key: its size, its rows, which server holds which elements, and how
// many pushes of it this worker sent. One record per key, made at init and held by pointer for
// the store's life, so an op reads it without copying it.
#pragma once

#include <kvstore/client/partition.hpp>
#include <kvstore/key.hpp>
#include <kvstore/options.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace kvstore::detail {

struct key_record {
  key_record(kvstore::key id, std::uint64_t n, std::uint64_t row_len, std::vector<slice_ref> sl,
             kvstore::partition part = kvstore::partition::hashed, kvstore::compression comp = {})
      : k(std::move(id)),
        total(n),
        row_length(row_len),
        slices(std::move(sl)),
        placement(part),
        compression(comp) {}

  const kvstore::key k;
  const std::uint64_t total;
  const std::uint64_t row_length;  ///< 0: a vector, no rows
  const std::vector<slice_ref> slices;
  /// Numbers this worker's pushes of the key (1, 2, ...), so a server restored from a snapshot
  /// applies a re-sent push exactly once.
  std::atomic<std::uint64_t> pushes{0};
  /// How the slices were laid out (init_options::partition).
  const kvstore::partition placement;
  /// The key's own wire compression (init_options::compression); type none: the store's setting.
  kvstore::compression compression{};
  /// This worker's two_bit residual (a std::vector<T>, client/compression.hpp), made at the
  /// key's first 2-bit push.
  std::shared_ptr<void> residual;
  /// The last compressed push's payload buffer, reused by the next when no frame holds it.
  std::shared_ptr<std::vector<std::byte>> encoded;

  std::uint64_t rows() const noexcept { return row_length ? total / row_length : 0; }
};

}  // namespace kvstore::detail
