// The multi-key calls a worker made lately, as it found and checked their keys, kept for later
// calls of the same kind that name the same keys (issue 12). Training pushes and pulls the same
// key lists step after step; over many keys, finding each key's record and reading it is most of
// what a call costs the caller (a cache miss or two per key). A call that matches a plan reads
// only what it was given, in order (each key's id and its buffer's size), against the plan's
// array, and its batches are built from the plan. The rules of planning (the second call of a
// list is planned, the bounds, the version) are detail/list_plans.hpp's. A plan names each key's
// record, which never moves (client/key_table.hpp). Plans are dropped when a key is removed (a
// failed init) or the store's compression changes, the two things that could change what was
// checked. A call naming a key by name is never planned: telling two names of one hash apart
// needs the record.
#pragma once

#include <kvstore/client/batch_frames.hpp>
#include <kvstore/client/key_record.hpp>
#include <kvstore/detail/list_plans.hpp>
#include <kvstore/key.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kvstore::detail {

class call_plans {
 public:
  /// One key of a planned call: what its batch entry or its op needs of the record.
  struct key_entry {
    key_record* rec;
    std::uint64_t id;
    std::uint64_t total;                 // elements
    int server;                          // rec->home
    bool batched;                        // small and plain: it travels in a batch
    std::atomic<std::uint64_t>* pushes;  // rec->pushes
  };

  /// What a plan was checked against: the key table's removals (key_table::removals_locked) and
  /// the store's compression (packed).
  struct version {
    std::uint64_t removals = 0;
    std::uint64_t compression = 0;
    friend bool operator==(const version&, const version&) = default;
  };

  struct call_info {
    bool repeats = false;      // a key was named twice in the call
    bool all_batched = false;  // every key travels in a batch
    /// A plan of distinct keys, all batched: the frames of its batches (one per batch of the
    /// call), cut once, when it was planned; else none.
    std::shared_ptr<const std::vector<batch_frames>> cuts;
  };

  /// Plans kept per kind of call: a few key lists a training step calls in turn.
  static constexpr std::size_t max_plans = 8;

  using lists = list_plans<key_entry, version, max_plans, call_info>;
  using plan = lists::plan;

  /// The plan a call naming `ks` with buffers `bufs`, at version `v`, follows; or nullptr.
  template <class Buf>
  const plan* find(std::span<const key> ks, std::span<const Buf> bufs, const version& v) {
    if (!plans_.valid_at(v)) return nullptr;
    const plan* p = plans_.find(signature_of(ks));
    if (!p) return nullptr;
    for (std::size_t i = 0; i < ks.size(); ++i)
      if (ks[i].is_named() || ks[i].id() != (*p)[i].id || bufs[i].size() != (*p)[i].total)
        return nullptr;
    return p;
  }

  /// An empty plan to fill (plan::add, key by key) for a call naming `ks` at version `v` that
  /// follows none; nullptr when the key list was not called lately (it is remembered). The
  /// plans keep at most twice the `held` keys (the key table's size) together. A plan started
  /// and not finished (a key turned out named) is never followed.
  plan* start(std::span<const key> ks, std::size_t held, const version& v) {
    plans_.valid_at(v);
    return plans_.start(signature_of(ks), ks.size(), held);
  }

  /// `p`'s call was found good: later calls may follow it. `repeats`: a key was named twice.
  /// When every key is batched and none twice, `cut(entries)` gives the batch_frames of the
  /// entries of one batch, for each batch of `batch_keys` keys.
  template <class Cut>
  void finish(plan& p, bool repeats, std::size_t batch_keys, Cut&& cut) {
    p.info.repeats = repeats;
    const auto& es = p.entries();
    p.info.all_batched =
        std::all_of(es.begin(), es.end(), [](const key_entry& e) { return e.batched; });
    if (p.info.all_batched && !repeats) {
      auto cuts = std::make_shared<std::vector<batch_frames>>();
      cuts->reserve((es.size() + batch_keys - 1) / batch_keys);
      for (std::size_t lo = 0; lo < es.size(); lo += batch_keys)
        cuts->push_back(
            cut(std::span<const key_entry>(es).subspan(lo, std::min(batch_keys, es.size() - lo))));
      p.info.cuts = std::move(cuts);
    }
    plans_.finish(p);
  }

  /// Entries the plans hold room for (their memory, 32 bytes each).
  std::size_t entries() const noexcept { return plans_.entries(); }

 private:
  static list_signature signature_of(std::span<const key> ks) {
    return list_signature::of(ks.size(), [&](std::size_t i) { return ks[i].id(); });
  }

  lists plans_;
};

}  // namespace kvstore::detail
