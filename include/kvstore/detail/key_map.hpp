// A map from key id to V whose values never move (the server's slices: requests keep pointers
// to them), found through a flat index (detail/flat_index.hpp) instead of a std::unordered_map's
// buckets and nodes: over many keys a lookup costs one cache miss for the index slot and one
// for the value, and a caller walking many keys can prefetch both some keys ahead (issue 12).
// The subset of std::unordered_map's interface the shard uses, with the same meanings; iteration
// order is unspecified, and an insert or erase invalidates iterators (not pointers to values).
//
// Values live in slabs of the map's own, one after the other in insertion order, at a stride that
// is not a multiple of 128 bytes. A frame's pass over 4,096 slices reads the same few lines of
// each; at a stride of 512 bytes (what malloc made of a 504-byte node) those lines fell in half
// of the L2's sets only, and a second pass over the frame found them evicted (cachegrind with a
// 2 MiB L2: 0.76 read misses a key on each of two lines of the second pass, none at 528 bytes).
#pragma once

#include <kvstore/detail/flat_index.hpp>
#include <kvstore/detail/prefetch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

// Under AddressSanitizer a slot that holds no value is poisoned: a use of an erased value is
// reported as a use after free would be.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSTORE_KEY_MAP_POISON 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVSTORE_KEY_MAP_POISON 1
#endif
#ifdef KVSTORE_KEY_MAP_POISON
#include <sanitizer/asan_interface.h>
#endif

namespace kvstore::detail {

template <class V>
class key_map {
 public:
  using value_type = std::pair<const std::uint64_t, V>;

 private:
  // A node starts a cache line: the first bytes of every value, what a walk over many keys
  // reads of each, fall in the same lines of every node (the fewest it can).
  struct alignas(64) node {
    value_type kv;
    std::size_t pos;  // where nodes_ holds it
  };

  // Where nodes live: slabs of node-sized slots, made as the map grows (16 slots, then twice
  // the last, up to 4,096) and kept until it is cleared; a slot freed by erase is used again.
  class slabs {
   public:
    /// Bytes from one slot to the next: the node's size rounded to its alignment (a line), and
    /// that much more when a multiple of 128, so the same fields of consecutive nodes spread
    /// over every cache set.
    static constexpr std::size_t stride = [] {
      constexpr std::size_t align = alignof(node);
      std::size_t n = (sizeof(node) + align - 1) / align * align;
      return n % 128 == 0 ? n + align : n;
    }();

    slabs() = default;
    // Moved from, a slab set is empty (the key_map moves its nodes with it).
    slabs(slabs&& o) noexcept { *this = std::move(o); }
    slabs& operator=(slabs&& o) noexcept {
      blocks_ = std::move(o.blocks_);
      free_ = std::move(o.free_);
      used_ = o.used_;
      last_slots_ = o.last_slots_;
      capacity_ = o.capacity_;
      o.clear();
      return *this;
    }

    /// Room for one node (not constructed yet).
    void* take() {
      void* at;
      if (!free_.empty()) {
        at = free_.back();
        free_.pop_back();
      } else {
        if (used_ == last_slots_) grow();
        at = blocks_.back().get() + stride * used_++;
      }
      unpoison(at, stride);
      return at;
    }
    /// A slot whose node was destroyed, for the next take().
    void give_back(void* at) noexcept {
      poison(at, stride);
      free_.push_back(at);
    }
    /// Drops every slot (the nodes in them destroyed already).
    void clear() noexcept {
      blocks_.clear();
      free_.clear();
      used_ = last_slots_ = capacity_ = 0;
    }

   private:
    struct deleter {
      std::size_t bytes = 0;
      void operator()(std::byte* p) const noexcept {
        unpoison(p, bytes);
        ::operator delete (p, std::align_val_t{block_align});
      }
    };
    static void poison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) noexcept {
#ifdef KVSTORE_KEY_MAP_POISON
      ASAN_POISON_MEMORY_REGION(p, n);
#endif
    }
    static void unpoison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) noexcept {
#ifdef KVSTORE_KEY_MAP_POISON
      ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
    }
    void grow() {
      // Room in free_ for every slot there will be, so give_back never allocates.
      const std::size_t slots =
          last_slots_ ? std::min<std::size_t>(2 * last_slots_, max_block_slots) : 16;
      free_.reserve(capacity_ + slots);
      const std::size_t bytes = stride * slots;
      std::unique_ptr<std::byte, deleter> block(
          static_cast<std::byte*>(::operator new (bytes, std::align_val_t{block_align})),
          deleter{bytes});
      poison(block.get(), bytes);
      blocks_.push_back(std::move(block));
      capacity_ += slots;
      last_slots_ = slots;
      used_ = 0;
    }
    static constexpr std::size_t max_block_slots = 4096;
    static constexpr std::size_t block_align = std::max<std::size_t>(64, alignof(node));
    std::vector<std::unique_ptr<std::byte, deleter>> blocks_;
    std::vector<void*> free_;
    std::size_t used_ = 0, last_slots_ = 0, capacity_ = 0;
  };

 public:
  /// What one value costs the map besides the value itself, at most: its slot in a slab, its
  /// places in the node list and the free list (up to two pointers each, as their vectors
  /// double), and the index slots (up to four a value, when the index has just doubled). A
  /// slab's slots not used yet come on top: at most max_block_slots of them.
  static constexpr std::size_t bytes_per_value =
      slabs::stride + 4 * sizeof(void*) + 4 * sizeof(id_slot<node>);

  template <bool Const>
  class basic_iterator {
   public:
    using ptr = node* const*;
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
  key_map(const key_map&) = delete;
  key_map& operator=(const key_map&) = delete;
  // A map moved from or replaced freed its values (as far as pointers taken before know).
  key_map(key_map&& o) noexcept
      : index_(std::move(o.index_)),
        nodes_(std::move(o.nodes_)),
        slabs_(std::move(o.slabs_)),
        frees_(o.frees_) {
    o.clear();
  }
  key_map& operator=(key_map&& o) noexcept {
    if (this == &o) return *this;
    destroy_all();
    index_ = std::move(o.index_);
    nodes_ = std::move(o.nodes_);
    slabs_ = std::move(o.slabs_);
    frees_ = std::max(frees_, o.frees_) + 1;
    o.clear();
    return *this;
  }
  ~key_map() { destroy_all(); }

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
    void* at = slabs_.take();
    node* fresh = nullptr;
    try {
      fresh = new (at) node{{id, V{}}, nodes_.size()};
      index_.insert(id, fresh);
    } catch (...) {  // nothing is added
      if (fresh) fresh->~node();
      slabs_.give_back(at);
      throw;
    }
    nodes_.push_back(fresh);  // reserved above: does not throw
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
    n->~node();
    slabs_.give_back(n);
    ++frees_;
    return 1;
  }

  std::size_t size() const noexcept { return nodes_.size(); }
  bool empty() const noexcept { return nodes_.empty(); }
  void clear() noexcept {
    destroy_all();
    index_.clear();
    ++frees_;
  }
  /// Counts the times values were freed (erase, clear, the map replaced or moved from): a
  /// pointer to a value, taken when this read n, is valid while it still reads n.
  std::uint64_t frees() const noexcept { return frees_; }

  /// Step i of a walk looking up id_of(0), ..., id_of(n - 1): prefetches the ids ahead and
  /// the first `value_bytes` bytes of their values (flat_index::prefetch_ahead).
  template <class IdOf>
  void prefetch_ahead(IdOf&& id_of, std::size_t i, std::size_t n,
                      std::size_t value_bytes) const noexcept {
    index_.prefetch_ahead(id_of, i, n,
                          [&](const node& nd) { prefetch_bytes(&nd.kv.second, value_bytes); });
  }

 private:
  void destroy_all() noexcept {
    for (node* n : nodes_) n->~node();
    nodes_.clear();
    slabs_.clear();
  }

  flat_index<node> index_;
  std::vector<node*> nodes_;  // in insertion order, but for erase's swaps
  slabs slabs_;
  std::uint64_t frees_ = 0;
};

}  // namespace kvstore::detail
