// A batched frame's walk over its keys (issue 12), shared by its init, push and pull: each key's
// slice found once (or taken from the frame's plan, server/frame_plans.hpp), the checks every
// batched request makes before anything changes, and the prefetches that overlap the keys' cache
// misses, which is where a frame of many small keys spends its time.
#pragma once

#include <kvstore/detail/prefetch.hpp>
#include <kvstore/error.hpp>
#include <kvstore/server/frame_plans.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kvstore::detail {

template <class Port>
class shard;

/// The first pass of the shard's batched requests (a friend of it) and the helpers they share:
/// batch_init_ops and batch_push_ops derive from it, batch_ops (server/batch.hpp) from both.
template <class Port>
struct batch_lookup {
  using shard_t = shard<Port>;
  using slice = key_slice<Port>;
  using planned = planned_slice<slice>;

 protected:
  // A push's or pull's first pass: each entry's slice (inited, the whole key, named once in the
  // frame) into sh.batch_slices_, and check(slice, entry) for each; throws at the first bad one.
  // A frame planned before (server/frame_plans.hpp) takes its slices from the plan, its entries
  // compared with the plan's in order (follow_plan); one that differs is looked up from its first
  // key again. `may_refuse`: whether check may refuse a slice now (when not, a planned frame's
  // slices are not read here). `hot`: the bytes of each slice that check and the second pass
  // read (prefetch_lines).
  template <class Check>
  static void find_slices(shard_t& sh, const wire::header& h, const wire::batch_entries& entries,
                          Check&& check, bool may_refuse, std::size_t hot = slice_hot_bytes) {
    auto& found = sh.batch_slices_;
    const std::size_t n = entries.size();
    found.resize(n);
    const std::uint64_t frees = sh.slices_.frees();
    if (const std::vector<planned>* plan = sh.plans_.find(entries, h.type, frees))
      if (follow_plan(*plan, entries, 0, n, check, may_refuse, hot, found)) return;
    const std::uint64_t stamp = ++sh.batch_stamp_;
    for (std::size_t i = 0; i < n; ++i) {
      prefetch_lookup(sh, entries, i);
      const wire::batch_entry e = entries[i];
      slice& s = whole_slice(sh, h, e);
      named_once(s, stamp);
      check(s, e);
      found[i] = &s;
    }
    sh.plans_.found(entries, h.type, found, frees, sh.slices_.size());
  }

  // Keys [lo, hi) of a frame that follows `plan`: found[i] is entry i's planned slice, after
  // check(slice, entry) when `may_refuse`. When no check can refuse a key, no slice is read
  // here, only the plan's copies of the keys, in order: over many keys a slice read here is a
  // cache miss, and the second pass misses on it again (a frame's slices leave the cache between
  // the passes). Reading none cut the server's CPU on a 1e6-key push of one worker by a fifth.
  // False at the first entry that differs from its plan.
  template <class Check>
  static bool follow_plan(const std::vector<planned>& plan, const wire::batch_entries& entries,
                          std::size_t lo, std::size_t hi, Check& check, bool may_refuse,
                          std::size_t hot, std::vector<slice*>& found) {
    for (std::size_t i = lo; i < hi; ++i) {
      const wire::batch_entry e = entries[i];
      if (!plan[i].names(e)) return false;
      if (may_refuse) {
        if (i + 8 < hi) prefetch_lines(plan[i + 8].slice, hot);
        check(*plan[i].slice, e);
      }
      found[i] = plan[i].slice;
    }
    return true;
  }

  // The cache lines of slice s's first `hot` bytes (slice_hot_bytes: its id, sizes, rounds
  // and marks, what a push reads; slice_lone_push_bytes: what a push of the only worker reads;
  // slice_pull_bytes: up to its value) start loading, each line once, the last one included.
  // Without the line of the last hot byte, a push's read of `cov` missed for three keys in four
  // (perf annotate: half the samples of the push loop on that one load).
  static void prefetch_lines(const slice* s, std::size_t hot) { prefetch_bytes(s, hot); }

  // A frame's first pass looks up every key: the keys ahead and their slices' first lines
  // start loading, so the misses of several keys overlap.
  static void prefetch_lookup(const shard_t& sh, const wire::batch_entries& entries,
                              std::size_t i) {
    sh.slices_.prefetch_ahead([&](std::size_t j) { return entries[j].key; }, i, entries.size(),
                              slice_hot_bytes);
  }

  // A frame's second pass over its slices (the first found them, but over many keys they left
  // the cache since): the slice 12 keys ahead, and for a value kept outside its slice the
  // buffer's block of the one 8 ahead and its bytes of the one 4 ahead start loading, so the
  // misses of several keys overlap. Not at or past `end`: keys served by another thread.
  // Whether a value is kept outside is read from its entry (`elem` bytes an element), not from
  // the slice: reading the slice 8 keys ahead, before its prefetched line arrived, was half the
  // samples of a 1e6-key push's pass (perf annotate).
  static void prefetch_ahead(const std::vector<slice*>& found, const wire::batch_entries& entries,
                             std::size_t elem, std::size_t i, std::size_t end,
                             std::size_t hot = slice_hot_bytes) {
    auto outside = [&](std::size_t j) {
      return !slice_value::fits_inline(entries[j].elements * elem);
    };
    if (i + 12 < end) prefetch_lines(found[i + 12], hot);
    if (i + 8 < end && outside(i + 8)) found[i + 8]->value.prefetch_block();
    if (i + 4 < end && outside(i + 4)) found[i + 4]->value.prefetch_bytes();
  }

  // While a frame's keys are served, answers wait for its changes (shard::begin_batch); also
  // when a key throws half-way (an optimizer's update).
  struct guard {
    explicit guard(shard_t& s) : sh(s) { sh.begin_batch(); }
    ~guard() { sh.end_batch(); }
    guard(const guard&) = delete;
    guard& operator=(const guard&) = delete;
    shard_t& sh;
  };

  // The payload holds exactly the entries' values.
  static void check_payload(const wire::header& h, std::size_t keys, std::uint64_t want,
                            std::size_t have) {
    if (!wire::dtype_size(h.type) || h.total > std::numeric_limits<std::uint64_t>::max() / 8 ||
        want != have)
      throw error(errc::protocol, "a batched request of " + std::to_string(keys) + " keys and " +
                                      std::to_string(h.total) + " elements with a payload of " +
                                      std::to_string(have) + " bytes");
  }

  // A key named twice in one frame: the worker never sends that.
  static void named_once(slice& s, std::uint64_t stamp) {
    if (s.batch_stamp == stamp)
      throw error(errc::protocol,
                  "key " + shard_t::key_str(s.key) + " named twice in one batched request");
    s.batch_stamp = stamp;
  }

  // The inited slice of entry e, which must be the whole key: a batch carries whole keys.
  static slice& whole_slice(shard_t& sh, const wire::header& h, const wire::batch_entry& e) {
    slice& s = sh.find(e.key, h.type, e.elements);
    if (s.lo != 0 || s.hi != s.total)
      throw error(errc::size_mismatch,
                  "key " + shard_t::key_str(e.key) + ": a batched request carries whole keys, " +
                      sh.who_ + " holds elements [" + std::to_string(s.lo) + ", " +
                      std::to_string(s.hi) + ") of its " + std::to_string(s.total));
    return s;
  }
};

}  // namespace kvstore::detail
