// A worker's records of its keys, by id: read by every op from any thread, added at init, and
// removed only when an init fails. Records never move and live as long as the table (a removed
// one too: an op racing the failed init may hold it), so an op keeps a plain pointer.
#pragma once

#include <kvstore/client/key_record.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

namespace kvstore::detail {

class key_table {
 public:
  /// The record of `id`, or nullptr.
  key_record* find(std::uint64_t id) const {
    std::shared_lock lk(m_);
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : it->second.get();
  }

  /// Adds `r` unless its id is taken; returns the record now under that id and whether it is r.
  std::pair<key_record*, bool> add(std::unique_ptr<key_record> r) {
    std::unique_lock lk(m_);
    auto [it, added] = records_.try_emplace(r->k.id(), nullptr);
    if (added) it->second = std::move(r);
    return {it->second.get(), added};
  }

  /// Holds the table for reading across many find_locked calls (a multi-key call's keys).
  std::shared_lock<std::shared_mutex> read_lock() const { return std::shared_lock(m_); }
  /// The record of `id`, or nullptr; read_lock() held.
  key_record* find_locked(std::uint64_t id) const {
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : it->second.get();
  }

  /// Adds every record of `rs` whose id is free, under one lock (a multi-key init); returns the
  /// index of the first one whose id is taken (rs.size(): none), whose record stays in `rs`.
  std::size_t add_all(std::vector<std::unique_ptr<key_record>>& rs,
                      std::vector<key_record*>& added) {
    std::unique_lock lk(m_);
    records_.reserve(records_.size() + rs.size());
    for (std::size_t i = 0; i < rs.size(); ++i) {
      auto [it, fresh] = records_.try_emplace(rs[i]->k.id(), nullptr);
      if (!fresh) return i;
      it->second = std::move(rs[i]);
      added.push_back(it->second.get());
    }
    return rs.size();
  }

  /// Forgets a key whose init failed.
  void remove(std::uint64_t id) {
    std::unique_lock lk(m_);
    auto it = records_.find(id);
    if (it == records_.end()) return;
    removed_.push_back(std::move(it->second));
    records_.erase(it);
  }

 private:
  mutable std::shared_mutex m_;
  std::unordered_map<std::uint64_t, std::unique_ptr<key_record>> records_;
  std::vector<std::unique_ptr<key_record>> removed_;
};

}  // namespace kvstore::detail
