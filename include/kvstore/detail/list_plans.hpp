// Plans of recent key lists: what a pass over a list's keys found, kept in order for the next
// time the same list comes (issue 12). Training sends the same key lists step after step, and
// finding each key's record is a cache miss or two per key; a list that follows a plan reads the
// plan's array instead. Two users: a worker's multi-key calls (client/call_plan.hpp) and a
// server's batched frames (server/frame_plans.hpp). The rules they share live here:
// - a list is told apart in constant time by its signature (length, a tag, three of its ids),
//   which is only a hint: the user compares each key with its entry before trusting it;
// - a signature is found in constant time however many lists are kept: plans and remembered
//   signatures are indexed by a hash of it (a server keeps hundreds, and looks up every frame);
// - a list is remembered the first time and planned the second, so lists that never repeat
//   (sparse rows) cost nothing more and never push a plan out;
// - bounded whatever comes: at most MaxLists plans and MaxLists remembered signatures, and the
//   plans' entries at most twice the keys the user holds (or one list alone, when longer); the
//   least lately used plan makes room;
// - every plan is made at a version the user names (what could change what a pass found); a new
//   version drops them all, since their entries may point at what is gone.
#pragma once

#include <kvstore/detail/flat_index.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvstore::detail {

/// A key list told apart in constant time: its length, a tag (an element type, say) and three
/// of its ids.
struct list_signature {
  std::size_t n = 0;
  std::uint64_t tag = 0, first = 0, middle = 0, last = 0;
  friend bool operator==(const list_signature&, const list_signature&) = default;

  /// The signature of a list of `n` keys whose i-th id is `id(i)`.
  template <class IdAt>
  static list_signature of(std::size_t n, IdAt&& id, std::uint64_t tag = 0) {
    if (n == 0) return {0, tag};
    return {n, tag, id(std::size_t{0}), id(n / 2), id(n - 1)};
  }

  /// 64 well-mixed bits of the signature (two signatures may share them).
  std::uint64_t hash() const noexcept {
    std::uint64_t h = n;
    for (std::uint64_t w : {tag, first, middle, last}) {
      h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    return h;
  }
};

/// A plan that keeps nothing about its list beyond its entries.
struct no_list_info {};

/// Entry: what one key's plan keeps. Version: equality-comparable, what plans were made at.
/// Info: what a plan keeps about its list beyond its entries.
template <class Entry, class Version, std::size_t MaxLists, class Info = no_list_info>
class list_plans {
 public:
  // Room for every plan at once: a plan never moves, so a plan found stays valid until the
  // next start() or valid_at() that drops it.
  list_plans() {
    plans_.reserve(MaxLists);
    reserve_indexes();
  }

  class plan {
   public:
    const Entry& operator[](std::size_t i) const noexcept { return (*entries_)[i]; }
    std::size_t size() const noexcept { return entries_->size(); }
    const std::vector<Entry>& entries() const noexcept { return *entries_; }
    /// The entries, shared: whoever holds them may read them outside the user's lock, after
    /// the plan is dropped or made anew (which replaces them, never changes them once finished).
    std::shared_ptr<const std::vector<Entry>> shared_entries() const noexcept { return entries_; }
    /// The list's next key, as the pass found it.
    void add(const Entry& e) { entries_->push_back(e); }
    Info info{};

   private:
    friend class list_plans;
    list_signature sig_;
    std::uint64_t used_ = 0;  // the clock when last made or followed
    bool ready_ = false;      // finished and not dropped: lists may follow it
    std::shared_ptr<std::vector<Entry>> entries_ = std::make_shared<std::vector<Entry>>();
  };

  /// True when the plans were made at `v`; else drops them all (and the remembered lists) and
  /// returns false.
  bool valid_at(const Version& v) {
    if (v == version_) return true;
    plans_.clear();
    seen_.fill(list_signature{});
    plan_index_.clear();
    seen_index_.clear();
    reserve_indexes();
    version_ = v;
    return false;
  }

  /// The finished plan of signature `sig`, marked as used; or nullptr.
  plan* find(const list_signature& sig) noexcept {
    plan* p = of(sig, sig.hash());
    if (!p || !p->ready_) return nullptr;
    p->used_ = ++clock_;
    return p;
  }

  /// An empty plan to fill with `n` entries for a list of signature `sig` that a pass is about to
  /// find (the user holds `held` keys): its own plan, else a new one or the least lately used
  /// one's place. nullptr when `sig` was not seen lately: it is remembered, and planned if it
  /// comes again. Older plans drop their entries until the new one fits the bound. The plan is
  /// not followed until finish().
  plan* start(const list_signature& sig, std::size_t n, std::size_t held) {
    const std::uint64_t hash = sig.hash();
    plan* p = of(sig, hash);
    if (!p) {
      list_signature* seen = seen_index_.find(hash);
      if (!seen || *seen != sig) {
        remember(sig, hash);
        return nullptr;
      }
      seen_index_.erase(hash);
      *seen = list_signature{};
      if (plans_.size() < MaxLists) {
        p = &plans_.emplace_back();
      } else {
        p = least_used(nullptr);
        unindex(plan_index_, p->sig_, p);
      }
      // Another list's signature of the same hash keeps the index: this plan is then never
      // found, and goes as the least lately used.
      plan_index_.insert(hash, p);
    }
    *p = plan{};
    p->sig_ = sig;
    p->used_ = ++clock_;
    make_room(n, held, p);
    p->entries_->reserve(n);
    return p;
  }

  /// `p` holds its list's entries: later lists of its signature may follow it.
  void finish(plan& p) noexcept {
    p.used_ = ++clock_;
    p.ready_ = true;
  }

  /// Entries the plans hold room for (their memory).
  std::size_t entries() const noexcept {
    std::size_t n = 0;
    for (const plan& p : plans_) n += p.entries_->capacity();
    return n;
  }
  /// Lists planned (finished, being filled, or dropped for room and kept by signature).
  std::size_t lists() const noexcept { return plans_.size(); }
  /// Lists remembered, seen once lately and not planned (at most MaxLists).
  std::size_t remembered() const noexcept { return seen_index_.size(); }

 private:
  plan* of(const list_signature& sig, std::uint64_t hash) noexcept {
    plan* p = plan_index_.find(hash);
    return p && p->sig_ == sig ? p : nullptr;
  }

  // Remembers `sig` (of `hash`) in the place of the signature remembered longest ago.
  void remember(const list_signature& sig, std::uint64_t hash) {
    list_signature& place = seen_[next_seen_++ % seen_.size()];
    unindex(seen_index_, place, &place);
    place = sig;
    seen_index_.insert(hash, &place);  // a hash taken: not remembered
  }

  // Takes `sig`'s hash out of `index` if it names `at` there (not another of the same hash).
  template <class V>
  static void unindex(flat_index<V>& index, const list_signature& sig, const V* at) noexcept {
    if (index.find(sig.hash()) == at) index.erase(sig.hash());
  }

  void reserve_indexes() {
    plan_index_.reserve(MaxLists + 1);
    seen_index_.reserve(MaxLists + 1);
  }

  // The least lately used plan other than `keep`, holding entries when `with_entries`.
  plan* least_used(const plan* keep, bool with_entries = false) noexcept {
    plan* oldest = nullptr;
    for (plan& p : plans_) {
      if (&p == keep || (with_entries && p.entries_->capacity() == 0)) continue;
      if (!oldest || p.used_ < oldest->used_) oldest = &p;
    }
    return oldest;
  }

  // Drops the entries of the least lately used plans until `n` more fit in twice the `held`
  // keys (or `n` alone, when more). A dropped plan keeps its signature: when its list comes
  // again it is planned at once.
  void make_room(std::size_t n, std::size_t held, const plan* keep) {
    const std::size_t bound = std::max(2 * held, n);
    std::size_t kept = entries();
    while (kept + n > bound) {
      plan* oldest = least_used(keep, /*with_entries=*/true);
      if (!oldest) break;
      kept -= oldest->entries_->capacity();
      // A new array: the old one's memory goes (once no reader shares it; clearing it would
      // keep the memory).
      oldest->entries_ = std::make_shared<std::vector<Entry>>();
      oldest->info = Info{};  // what it kept of its list goes with the list
      oldest->ready_ = false;
    }
  }

  std::vector<plan> plans_;                      // at most MaxLists, reserved: they never move
  std::array<list_signature, MaxLists> seen_{};  // lists seen once lately, not planned
  flat_index<plan> plan_index_;                  // plans_ by their signatures' hashes
  flat_index<list_signature> seen_index_;        // seen_ by hash
  std::size_t next_seen_ = 0;
  std::uint64_t clock_ = 0;
  Version version_{};
};

}  // namespace kvstore::detail
