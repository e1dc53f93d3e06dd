// A worker's records of its keys, by id: read by every op from any thread, added at init, and
// removed only when an init fails. Records never move and live as long as the table (a removed
// one too: an op racing the failed init may hold it), so an op keeps a plain pointer. Ids are
// found through a flat index (detail/flat_index.hpp): a multi-key call looks up every key, and
// prefetches the ones ahead.
#pragma once

#include <kvstore/client/key_record.hpp>
#include <kvstore/detail/flat_index.hpp>
#include <kvstore/detail/prefetch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

namespace kvstore::detail {

class key_table {
 public:
  /// The record of `id`, or nullptr.
  key_record* find(std::uint64_t id) const {
    std::shared_lock lk(m_);
    return index_.find(id);
  }

  /// Adds `r` unless its id is taken; returns the record now under that id and whether it is r.
  std::pair<key_record*, bool> add(std::unique_ptr<key_record> r) {
    std::unique_lock lk(m_);
    key_record* now = index_.insert(r->k.id(), r.get());
    if (now != r.get()) return {now, false};
    r->pushes = new_push_count();  // before the lock goes: no op has found the record yet
    owned_.push_back(std::move(r));
    return {now, true};
  }

  /// Holds the table for reading across many find_locked calls (a multi-key call's keys).
  std::shared_lock<std::shared_mutex> read_lock() const { return std::shared_lock(m_); }
  /// The record of `id`, or nullptr; read_lock() held.
  key_record* find_locked(std::uint64_t id) const { return index_.find(id); }
  /// Step i of a walk calling find_locked(id_of(0)), ..., find_locked(id_of(n - 1)): prefetches
  /// the ids ahead and the first two lines of their records, which a call reads
  /// (flat_index::prefetch_ahead); read_lock() held.
  template <class IdOf>
  void prefetch_ahead_locked(IdOf&& id_of, std::size_t i, std::size_t n) const {
    index_.prefetch_ahead(id_of, i, n, [](const key_record& r) { prefetch_bytes(&r, 128); });
  }

  /// Adds every record of `rs` whose id is free, under one lock (a multi-key init); returns the
  /// index of the first one whose id is taken (rs.size(): none), whose record stays in `rs`.
  std::size_t add_all(std::vector<std::unique_ptr<key_record>>& rs,
                      std::vector<key_record*>& added) {
    std::unique_lock lk(m_);
    index_.reserve(index_.size() + rs.size());
    owned_.reserve(owned_.size() + rs.size());
    for (std::size_t i = 0; i < rs.size(); ++i) {
      if (index_.insert(rs[i]->k.id(), rs[i].get()) != rs[i].get()) return i;
      rs[i]->pushes = new_push_count();
      added.push_back(rs[i].get());
      owned_.push_back(std::move(rs[i]));
    }
    return rs.size();
  }

  /// Forgets a key whose init failed.
  void remove(std::uint64_t id) {
    std::unique_lock lk(m_);
    if (index_.erase(id)) ++removals_;  // the record stays in owned_: an op may still hold it
  }
  /// Keys held; read_lock() held.
  std::size_t size_locked() const noexcept { return index_.size(); }
  /// Keys removed so far: a plan of records found earlier (client/call_plan.hpp) holds while
  /// this has not changed. read_lock() held.
  std::uint64_t removals_locked() const noexcept { return removals_; }

 private:
  // A zero count for the record added now (m_ held): the next in one of chunks that never move.
  std::atomic<std::uint64_t>* new_push_count() {
    if (counts_used_ == count_chunk) {
      push_counts_.push_back(std::make_unique<std::atomic<std::uint64_t>[]>(count_chunk));
      counts_used_ = 0;
    }
    return &push_counts_.back()[counts_used_++];
  }
  static constexpr std::size_t count_chunk = 4096;

  mutable std::shared_mutex m_;
  flat_index<key_record> index_;                    // the records in use, by id
  std::vector<std::unique_ptr<key_record>> owned_;  // every record added, removed ones too
  std::uint64_t removals_ = 0;
  // The records' push counts (key_record::pushes), in the order they were added: a training
  // step pushes its keys in about the order it inited them, so a multi-key push reads these
  // counts one line per eight keys, where each key's record was a cache miss of its own.
  std::vector<std::unique_ptr<std::atomic<std::uint64_t>[]>> push_counts_;
  std::size_t counts_used_ = count_chunk;  // in push_counts_.back()
};

}  // namespace kvstore::detail
