// The multi-key calls a worker made lately, as it found and checked their keys, kept for later
// calls of the same kind that name the same keys (issue 12). Training pushes and pulls the same
// key lists step after step; over many keys, finding each key's record and reading it is most of
// what a call costs the caller (a cache miss or two per key). A call that matches a plan reads
// only what it was given, in order (each key's id and its buffer's size), against the plan's
// array, and its batches are built from the plan. A plan names each key's record, which never
// moves (client/key_table.hpp). Plans are dropped when a key is removed (a failed init) or the
// store's compression changes, the two things that could change what was checked. A call naming
// a key by name is never planned: telling two names of one hash apart needs the record.
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
    std::uint64_t fingerprint_ = 0;
    version made_at_;
    std::uint64_t used_ = 0;  // the cache's clock when last made or followed
    bool repeats_ = false;
    bool ready_ = false;  // finished: calls may follow it
  };

  /// Plans kept per kind of call: a few key lists a training step calls in turn.
  static constexpr std::size_t max_plans = 8;

  /// A call's keys in one word, never 0; 0 when a key is named (never planned).
  static std::uint64_t fingerprint(std::span<const key> ks) noexcept {
    std::uint64_t h = 0x9E3779B97F4A7C15ull ^ ks.size();
    for (const key& k : ks) {
      if (k.is_named()) return 0;
      h = (h ^ k.id()) * 0x100000001B3ull;
      h ^= h >> 29;
    }
    return h | 1;
  }

  /// The plan a call naming `ks` with buffers `bufs`, at version `v`, follows; or nullptr.
  template <class Buf>
  const plan* find(std::span<const key> ks, std::span<const Buf> bufs, std::uint64_t fingerprint,
                   const version& v) {
    if (!fingerprint) return nullptr;
    for (plan& p : plans_) {
      if (!p.ready_ || p.fingerprint_ != fingerprint || p.keys_.size() != ks.size()) continue;
      if (p.made_at_ != v) return nullptr;  // made before a change: planned afresh
      for (std::size_t i = 0; i < ks.size(); ++i)
        if (ks[i].id() != p.keys_[i].id || bufs[i].size() != p.keys_[i].total) return nullptr;
      p.used_ = ++clock_;
      return &p;
    }
    return nullptr;
  }

  /// An empty plan to fill for a call of `n` keys, in place of the plan of the same keys made
  /// before a change, or of the one followed least lately; nullptr when the call cannot be
  /// planned (fingerprint 0). Plans keep at most twice the `held` keys (the key table's size)
  /// together, the new one included: older ones are freed to make room.
  plan* start(std::uint64_t fingerprint, std::size_t n, std::size_t held) {
    if (!fingerprint) return nullptr;
    plan* p = &plans_[0];
    for (plan& q : plans_) {
      if (q.fingerprint_ == fingerprint && q.keys_.size() == n) {
        p = &q;
        break;
      }
      if (q.used_ < p->used_) p = &q;
    }
    p->ready_ = false;
    p->keys_.clear();
    p->fingerprint_ = fingerprint;
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
  std::uint64_t clock_ = 0;
};

}  // namespace kvstore::detail
