// A map from key id to V whose values never move (the server's slices: requests keep pointers
// to them), found through a flat index (detail/flat_index.hpp) instead of a std::unordered_map's
// buckets and nodes: over many keys a lookup costs one cache miss for the index slot and one
// for the value, and a caller walking many keys can prefetch both some keys ahead (issue 12).
// The subset of std::unordered_map's interface the shard uses, with the same meanings; iteration
// order is unspecified, and an insert or erase invalidates iterators (not pointers to values).
#pragma once

#include <kvstore/detail/flat_index.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore::detail {

template <class V>
class key_map {
 public:
  using value_type = std::pair<const std::uint64_t, V>;

 private:
  struct node {
    value_type kv;
    std::size_t pos;  // where nodes_ holds it
  };

 public:
  template <bool Const>
  class basic_iterator {
   public:
    using ptr = std::conditional_t<Const, const std::unique_ptr<node>*, std::unique_ptr<node>*>;
    using ref = std::conditional_t<Const, const value_type&, value_type&>;
    basic_iterator() = default;
    explicit basic_iterator(ptr p) : p_(p) {}
    // An iterator converts to a const_iterator (a constructor, not a conversion operator: in
    // the const one an operator would convert to its own type, which nvcc warns of).
    template <bool C = Const, std::enable_if_t<C, int> = 0>
    basic_iterator(const basic_iterator<false>& o) : p_(o.p_) {}  // NOLINT: implicit
    ref operator*() const { return (*p_)->kv; }
    auto* operator->() const { return &(*p_)->kv; }
    basic_iterator& operator++() {
      ++p_;
      return *this;
    }
    friend bool operator==(const basic_iterator& a, const basic_iterator& b) {
      return a.p_ == b.p_;
    }

   private:
    friend class basic_iterator<!Const>;
    ptr p_ = nullptr;
  };
  using iterator = basic_iterator<false>;
  using const_iterator = basic_iterator<true>;

  key_map() = default;
  // A map moved from or replaced freed its values (as far as pointers taken before know).
  key_map(key_map&& o) noexcept
      : index_(std::move(o.index_)), nodes_(std::move(o.nodes_)), frees_(o.frees_) {
    o.clear();
  }
  key_map& operator=(key_map&& o) noexcept {
    if (this == &o) return *this;
    index_ = std::move(o.index_);
    nodes_ = std::move(o.nodes_);
    frees_ = std::max(frees_, o.frees_) + 1;
    o.clear();
    return *this;
  }

  iterator begin() noexcept { return iterator(nodes_.data()); }
  iterator end() noexcept { return iterator(nodes_.data() + nodes_.size()); }
  const_iterator begin() const noexcept { return const_iterator(nodes_.data()); }
  const_iterator end() const noexcept { return const_iterator(nodes_.data() + nodes_.size()); }

  iterator find(std::uint64_t id) noexcept {
    node* n = index_.find(id);
    return n ? iterator(nodes_.data() + n->pos) : end();
  }
  const_iterator find(std::uint64_t id) const noexcept {
    const node* n = index_.find(id);
    return n ? const_iterator(nodes_.data() + n->pos) : end();
  }
  std::size_t count(std::uint64_t id) const noexcept { return index_.find(id) ? 1 : 0; }
  /// The value of `id`, or nullptr. Cheaper than find(): an iterator points into the list of
  /// nodes, which a lookup reaches only through the node's position, two more cache misses per
  /// key over many keys than the value itself.
  V* find_value(std::uint64_t id) noexcept {
    node* n = index_.find(id);
    return n ? &n->kv.second : nullptr;
  }
  const V* find_value(std::uint64_t id) const noexcept {
    const node* n = index_.find(id);
    return n ? &n->kv.second : nullptr;
  }
  V& at(std::uint64_t id) {
    node* n = index_.find(id);
    if (!n) throw std::out_of_range("key_map::at: no such id");
    return n->kv.second;
  }
  const V& at(std::uint64_t id) const {
    const node* n = index_.find(id);
    if (!n) throw std::out_of_range("key_map::at: no such id");
    return n->kv.second;
  }

  /// The value of `id`, value-initialized and added if new; and whether it was added.
  std::pair<iterator, bool> try_emplace(std::uint64_t id) {
    if (node* n = index_.find(id)) return {iterator(nodes_.data() + n->pos), false};
    if (nodes_.size() == nodes_.capacity())  // doubling: nothing is added if this throws
      nodes_.reserve(std::max<std::size_t>(16, nodes_.size() * 2));
    auto fresh = std::unique_ptr<node>(new node{{id, V{}}, nodes_.size()});
    index_.insert(id, fresh.get());
    nodes_.push_back(std::move(fresh));
    return {iterator(nodes_.data() + nodes_.size() - 1), true};
  }
  V& operator[](std::uint64_t id) { return try_emplace(id).first->second; }

  /// Removes `id`'s value (the last one takes its place in the iteration order).
  std::size_t erase(std::uint64_t id) {
    node* n = index_.erase(id);
    if (!n) return 0;
    const std::size_t at = n->pos;
    if (at + 1 != nodes_.size()) {
      std::swap(nodes_[at], nodes_.back());
      nodes_[at]->pos = at;
    }
    nodes_.pop_back();
    ++frees_;
    return 1;
  }

  std::size_t size() const noexcept { return nodes_.size(); }
  bool empty() const noexcept { return nodes_.empty(); }
  void clear() noexcept {
    index_.clear();
    nodes_.clear();
    ++frees_;
  }
  /// Counts the times values were freed (erase, clear, the map replaced or moved from): a
  /// pointer to a value, taken when this read n, is valid while it still reads n.
  std::uint64_t frees() const noexcept { return frees_; }

  /// Step i of a walk looking up id_of(0), ..., id_of(n - 1): prefetches the ids ahead and
  /// the first `lines` cache lines of their values (flat_index::prefetch_ahead).
  template <class IdOf>
  void prefetch_ahead(IdOf&& id_of, std::size_t i, std::size_t n, int lines) const noexcept {
    index_.prefetch_ahead(id_of, i, n, lines);
  }

 private:
  flat_index<node> index_;
  std::vector<std::unique_ptr<node>> nodes_;
  std::uint64_t frees_ = 0;
};

}  // namespace kvstore::detail
