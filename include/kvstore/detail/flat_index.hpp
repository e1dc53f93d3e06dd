// An id -> pointer table with open addressing (linear probing) for the per-key tables that a
// multi-key call reads once per key (issue 12). A lookup reads one 16-byte slot where a
// std::unordered_map reads a bucket, the node before, and the node: over a million keys each of
// those is a cache miss. And a caller walking many keys can prefetch the slot of a key some
// iterations ahead (prefetch), so the misses of several keys overlap. Not thread-safe: the owner
// locks. The pointed-to objects are the owner's; the table never moves or frees them.
#pragma once

#include <kvstore/detail/prefetch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvstore::detail {

/// One slot of an id -> pointer table (flat_index, id_ring).
template <class V>
struct id_slot {
  std::uint64_t id = 0;
  V* v = nullptr;  // null: empty
};

template <class V>
class flat_index {
 public:
  /// The object of `id`, or nullptr.
  V* find(std::uint64_t id) const noexcept {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = home(id);; i = next(i)) {
      const slot& s = slots_[i];
      if (!s.v) return nullptr;
      if (s.id == id) return s.v;
    }
  }

  /// Adds `v` (not null) under `id` unless the id is taken; returns the object now under it.
  V* insert(std::uint64_t id, V* v) {
    if ((size_ + 1) * 2 > slots_.size()) grow(std::max((size_ + 1) * 2, slots_.size() * 2));
    std::size_t i = home(id);
    for (; slots_[i].v; i = next(i))
      if (slots_[i].id == id) return slots_[i].v;
    slots_[i] = {id, v};
    ++size_;
    return v;
  }

  /// Forgets `id`; returns its object, or nullptr. Later slots of the probe run shift back, so
  /// no tombstone slows later lookups.
  V* erase(std::uint64_t id) noexcept {
    if (slots_.empty()) return nullptr;
    std::size_t i = home(id);
    for (; slots_[i].v && slots_[i].id != id; i = next(i)) {
    }
    V* gone = slots_[i].v;
    if (!gone) return nullptr;
    for (std::size_t j = next(i); slots_[j].v; j = next(j)) {
      // Slot j's entry may move to the hole at i unless its home lies cyclically in (i, j].
      if (distance(home(slots_[j].id), j) >= distance(i, j)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --size_;
    return gone;
  }

  /// Starts loading the slot where a lookup of `id` begins (a hint; nothing is read).
  void prefetch(std::uint64_t id) const noexcept {
    if (!slots_.empty()) detail::prefetch(&slots_[home(id)]);
  }

  /// Step i of a walk that looks up id_of(0), ..., id_of(n - 1) in turn: starts loading the
  /// slot of the id 16 steps ahead, and calls touch(object) for the id 8 ahead (its slot loaded
  /// 8 steps ago), which starts loading what the walk will read of it, so the misses of several
  /// lookups overlap.
  template <class IdOf, class Touch>
  void prefetch_ahead(IdOf&& id_of, std::size_t i, std::size_t n, Touch&& touch) const noexcept {
    if (i + 16 < n) prefetch(id_of(i + 16));
    if (i + 8 < n)
      if (const V* v = find(id_of(i + 8))) touch(*v);
  }

  /// Room for n ids without growing.
  void reserve(std::size_t n) {
    if (n * 2 > slots_.size()) grow(n * 2);
  }
  std::size_t size() const noexcept { return size_; }
  void clear() noexcept {
    slots_.clear();
    mask_ = 0;
    size_ = 0;
  }

 private:
  using slot = id_slot<V>;

  // A key's home: ids of one run of 16 consecutive ids (a model's layers are often numbered
  // in a row) share a block of 16 slots, so a call over them walks a few cache lines in order;
  // the blocks are spread by Fibonacci hashing of id / 16, so runs of ids do not pile up into
  // one long probe sequence (as they would with the id itself as the home), and neither do
  // strided ids (multiples of 1024, say). Hashed names have random low bits anyway.
  std::size_t home(std::uint64_t id) const noexcept {
    const std::uint64_t block = ((id >> 4) * 0x9E3779B97F4A7C15ull) >> shift_;
    return static_cast<std::size_t>((block << 4) | (id & 15)) & mask_;
  }
  std::size_t next(std::size_t i) const noexcept { return (i + 1) & mask_; }
  // Steps from slot a forward to slot b, wrapping.
  std::size_t distance(std::size_t a, std::size_t b) const noexcept { return (b - a) & mask_; }

  void grow(std::size_t at_least) {
    std::size_t n = 64;
    unsigned bits = 6;
    while (n < at_least) {
      n *= 2;
      ++bits;
    }
    std::vector<slot> old(n);
    old.swap(slots_);
    mask_ = n - 1;
    shift_ = 64 - (bits - 4);  // the block number's bits
    size_ = 0;
    for (const slot& s : old)
      if (s.v) insert(s.id, s.v);
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;  // slots_.size() - 1, a power of two less one
  unsigned shift_ = 62;
  std::size_t size_ = 0;
};

}  // namespace kvstore::detail
