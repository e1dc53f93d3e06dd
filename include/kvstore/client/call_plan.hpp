// The multi-key calls a worker made lately, as it found and checked their keys, kept for later
// calls of the same kind that name the same keys (issue 12). Training pushes and pulls the same
// key lists step after step; over many keys, finding each key's record and reading it is most of
// what a call costs the caller (a cache miss or two per key). A call that matches a plan reads
// only what it was given, in order (each key's id and its buffer's size), against the plan's
// array, and its batches are built from the plan. A key list is planned the second time it is
// called (recently): a call that never repeats (sparse rows) costs nothing more. A plan names
// each key's record, which never moves (client/key_table.hpp). Plans are dropped when a key is
// removed (a failed init) or the store's compression changes, the two things that could change
// what was checked. A call naming a key by name is never planned: telling two names of one hash
// apart needs the record.
#pragma once

#include <kvstore/client/key_record.hpp>
#include <kvstore/key.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvstore::detail {

class call_plans {
 public:
  /// One key of a planned call: what its batch entry or its op needs of the record.
  struct key_entry {
    key_record* rec;
    std::uint64_t id;
    std::uint64_t total;  // elements
    int server;           // rec->home
    bool batched;         // small and plain: it travels in a batch
  };

  /// What a plan was checked against: the key table's removals (key_table::removals_locked) and
  /// the store's compression (packed).
  struct version {
    std::uint64_t removals = 0;
    std::uint64_t compression = 0;
    friend bool operator==(const version&, const version&) = default;
  };

  /// A call's key list told apart in constant time: its length and three of its ids. Equal
  /// signatures are only a hint; a call follows a plan once every id is compared.
  struct signature {
    std::size_t n = 0;
    std::uint64_t first = 0, middle = 0, last = 0;
    friend bool operator==(const signature&, const signature&) = default;
  };
  static signature signature_of(std::span<const key> ks) noexcept {
    if (ks.empty()) return {};
    return {ks.size(), ks.front().id(), ks[ks.size() / 2].id(), ks.back().id()};
  }

  class plan {
   public:
    const key_entry& operator[](std::size_t i) const noexcept { return keys_[i]; }
    std::size_t size() const noexcept { return keys_.size(); }
    /// A key was named twice in the call.
    bool repeats() const noexcept { return repeats_; }
    /// The call's next key, as it was checked.
    void add(const key_entry& e) { keys_.push_back(e); }

   private:
    friend class call_plans;
    std::vector<key_entry> keys_;
    signature signature_;
    version made_at_;
    std::uint64_t used_ = 0;  // the cache's clock when last made or followed
    bool repeats_ = false;
    bool ready_ = false;  // finished: calls may follow it
  };

  /// Plans kept per kind of call: a few key lists a training step calls in turn. As many key
  /// lists seen once are remembered, to be planned when called again.
  static constexpr std::size_t max_plans = 8;

  /// The plan a call naming `ks` with buffers `bufs`, at version `v`, follows; or nullptr.
  template <class Buf>
  const plan* find(std::span<const key> ks, std::span<const Buf> bufs, const version& v) {
    const signature sig = signature_of(ks);
    for (plan& p : plans_) {
      if (!p.ready_ || p.signature_ != sig) continue;
      if (p.made_at_ != v) return nullptr;  // made before a change: planned afresh
      for (std::size_t i = 0; i < ks.size(); ++i)
        if (ks[i].is_named() || ks[i].id() != p.keys_[i].id || bufs[i].size() != p.keys_[i].total)
          return nullptr;
      p.used_ = ++clock_;
      return &p;
    }
    return nullptr;
  }

  /// An empty plan to fill for a call naming `ks` that follows none: in place of a plan of the
  /// same signature, or of the one followed least lately. nullptr when the key list was not
  /// called lately: it is remembered, and planned if it is called again. Plans keep at most
  /// twice the `held` keys (the key table's size) together, the new one included: older ones
  /// are freed to make room. A plan started and not finished (a key turned out named) is never
  /// followed.
  plan* start(std::span<const key> ks, std::size_t held) {
    const signature sig = signature_of(ks);
    plan* p = nullptr;
    for (plan& q : plans_)
      if (q.signature_ == sig && q.keys_.capacity()) p = &q;
    if (!p) {
      // Seen lately? Else remembered (in place of the oldest signature) and not planned.
      auto seen = std::find(seen_.begin(), seen_.end(), sig);
      if (seen == seen_.end()) {
        seen_[next_seen_++ % seen_.size()] = sig;
        return nullptr;
      }
      *seen = signature{};
      p = &plans_[0];
      for (plan& q : plans_)
        if (q.used_ < p->used_) p = &q;
    }
    const std::size_t n = ks.size();
    p->ready_ = false;
    p->keys_.clear();
    p->signature_ = sig;
    const std::size_t limit = std::max(2 * held, n);
    for (;;) {
      std::size_t kept = n;
      plan* oldest = nullptr;
      for (plan& q : plans_) {
        if (&q == p || q.keys_.capacity() == 0) continue;
        kept += q.keys_.capacity();
        if (!oldest || q.used_ < oldest->used_) oldest = &q;
      }
      if (kept <= limit || !oldest) break;
      *oldest = plan{};
    }
    p->keys_.reserve(n);
    return p;
  }

  /// `p`'s call was found good: later calls may follow it. `repeats`: a key was named twice.
  void finish(plan& p, bool repeats, const version& v) noexcept {
    p.repeats_ = repeats;
    p.made_at_ = v;
    p.used_ = ++clock_;
    p.ready_ = true;
  }

  /// Entries the plans hold (their memory, 32 bytes each).
  std::size_t entries() const noexcept {
    std::size_t n = 0;
    for (const plan& p : plans_) n += p.keys_.capacity();
    return n;
  }

 private:
  std::array<plan, max_plans> plans_;
  std::array<signature, max_plans> seen_{};  // key lists called once lately, not planned
  std::size_t next_seen_ = 0;
  std::uint64_t clock_ = 0;
};

}  // namespace kvstore::detail
