// What a worker knows of one key: its size, its rows, which server holds which elements, and how
// many pushes of it this worker sent. One record per key, made at init and held by pointer for
// the store's life, so an op reads it without copying it.
#pragma once

#include <kvstore/client/partition.hpp>
#include <kvstore/engine/key_slot.hpp>
#include <kvstore/key.hpp>
#include <kvstore/options.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace kvstore::detail {

struct alignas(64) key_record {
  key_record(kvstore::key id, std::uint64_t n, std::uint64_t row_len, std::vector<slice_ref> sl,
             kvstore::partition part = kvstore::partition::hashed, kvstore::compression comp = {})
      : total(n),
        home(sl.size() == 1 ? sl.front().server : -1),
        named(id.is_named()),
        own_compression(comp.type != kvstore::compression::none),
        k(std::move(id)),
        row_length(row_len),
        slices(std::move(sl)),
        placement(part),
        compression(comp) {}

  // The first cache line holds what a multi-key call reads or writes of every key it names
  // (client/batch.hpp), so a million keys cost a million lines, not three million.
  const std::uint64_t total;
  /// The key's queue in the store's engine (per-key order of its ops), kept here so queuing an
  /// op needs no lookup; the engine reads and writes it under its lock.
  mutable key_slot queue;
  /// Numbers this worker's pushes of the key (1, 2, ...), so a server restored from a snapshot
  /// applies a re-sent push exactly once. Only the key's ops touch it, one at a time (engine).
  /// It points at own_pushes until the key table takes the record: then at the table's count of
  /// the key, kept with the others in the order keys were added (client/key_table.hpp), where a
  /// multi-key push's walk numbers its keys without reading their records.
  std::atomic<std::uint64_t>* pushes = &own_pushes;
  /// The multi-key call that named the key last (a key named twice in one call is found
  /// without a lookup); written under the store's lock for those calls.
  std::uint64_t batch_call = 0;
  /// The server holding the whole value (one slice), or -1 when it is sliced over several.
  const int home;
  const bool named;            ///< k.is_named()
  const bool own_compression;  ///< compression.type != none: the store's setting does not apply

  const kvstore::key k;
  std::uint32_t batch_at = 0;      ///< where batch_call named it (client/batch.hpp)
  const std::uint64_t row_length;  ///< 0: a vector, no rows
  const std::vector<slice_ref> slices;
  /// How the slices were laid out (init_options::partition).
  const kvstore::partition placement;
  /// The key's own wire compression (init_options::compression); type none: the store's setting.
  const kvstore::compression compression{};
  /// This worker's two_bit residual (a std::vector<T>, client/compression.hpp), made at the
  /// key's first 2-bit push.
  std::shared_ptr<void> residual;
  /// The last compressed push's payload buffer, reused by the next when no frame holds it.
  std::shared_ptr<std::vector<std::byte>> encoded;
  /// The push count of a record no key table holds (pushes).
  std::atomic<std::uint64_t> own_pushes{0};

  std::uint64_t rows() const noexcept { return row_length ? total / row_length : 0; }
};

/// The next number of a key's pushes (key_record::pushes). Only the key's ops number them, one
/// at a time (the engine hands a key from op to op under its lock), so a plain load and store
/// do: a locked increment is a full barrier, which waited for every store before it (a tenth
/// of a one-key push's time on the caller's thread).
inline std::uint64_t next_push_seq(std::atomic<std::uint64_t>& count) noexcept {
  const std::uint64_t seq = count.load(std::memory_order_relaxed) + 1;
  count.store(seq, std::memory_order_relaxed);
  return seq;
}

}  // namespace kvstore::detail
