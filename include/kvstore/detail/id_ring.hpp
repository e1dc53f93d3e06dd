// An index of objects by ids handed out in increasing order, most of them done soon after: a
// worker's request ids (client/pending.hpp, issue 12). Id i lives in slot i mod the ring's size,
// so a lookup, an insert and an erase are one slot each, with no probing: the ids in flight are
// consecutive, or nearly. An id still there when a newer one needs its slot (a request that
// waits long: a held pull, a barrier) moves to a small map beside the ring. The ring holds at
// least twice the ids in it, so such moves are rare, and the memory is bounded by the ids held.
// Not thread-safe: the owner locks. The objects are the owner's; the index never moves or frees
// them.
#pragma once

#include <kvstore/detail/flat_index.hpp>  // id_slot

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

template <class V>
class id_ring {
 public:
  /// The object of `id`, or nullptr.
  V* find(std::uint64_t id) const noexcept {
    if (!ring_.empty())
      if (const slot& s = ring_[id & mask_]; s.v && s.id == id) return s.v;
    if (aside_.empty()) return nullptr;
    auto it = aside_.find(id);
    return it == aside_.end() ? nullptr : it->second;
  }

  /// Adds `v` (not null) under `id`, which is not in the index.
  void insert(std::uint64_t id, V* v) {
    if ((size_ + 1) * 2 > ring_.size()) grow();
    place(id, v);
    ++size_;
  }

  /// Forgets `id`; returns its object, or nullptr.
  V* erase(std::uint64_t id) noexcept {
    V* v = nullptr;
    if (slot* s = ring_.empty() ? nullptr : &ring_[id & mask_]; s && s->v && s->id == id) {
      v = s->v;
      *s = {};
    } else if (aside_.empty()) {
      return nullptr;
    } else if (auto it = aside_.find(id); it != aside_.end()) {
      v = it->second;
      aside_.erase(it);
    }
    if (v) --size_;
    return v;
  }

  std::size_t size() const noexcept { return size_; }
  /// Ids moved aside (waiting while a newer id took their slot).
  std::size_t aside() const noexcept { return aside_.size(); }
  /// Forgets every id and frees the ring.
  void clear() noexcept {
    ring_ = {};
    aside_.clear();
    mask_ = 0;
    size_ = 0;
  }

 private:
  using slot = id_slot<V>;

  // Puts id in its slot, moving an older id there aside.
  void place(std::uint64_t id, V* v) {
    slot& s = ring_[id & mask_];
    if (s.v) aside_.emplace(s.id, s.v);
    s = {id, v};
  }

  // Twice the slots (64 at first); the ids held are placed anew, those aside too.
  void grow() {
    std::vector<slot> old(ring_.empty() ? 64 : 2 * ring_.size());
    old.swap(ring_);
    mask_ = ring_.size() - 1;
    std::unordered_map<std::uint64_t, V*> aside;
    aside.swap(aside_);
    for (const slot& s : old)
      if (s.v) place(s.id, s.v);
    for (const auto& [id, v] : aside) place(id, v);
  }

  std::vector<slot> ring_;  // a power of two in size
  std::unordered_map<std::uint64_t, V*> aside_;
  std::uint64_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace kvstore::detail
