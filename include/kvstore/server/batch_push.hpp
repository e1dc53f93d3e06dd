// A batched push (issue 12): each key's value summed into its sync round or applied at once, key
// after key on the io thread, or, for a frame of many keys seen before where cores are to spare,
// in runs of keys on the apply pool's threads (push_in_runs) that hand back to the io thread what
// only it may do. The shard's rules for a push (server/shard.hpp) applied to whole keys.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/server/apply_pool.hpp>
#include <kvstore/server/batch_lookup.hpp>
#include <kvstore/server/batch_waits.hpp>
#include <kvstore/server/frame_plans.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore::detail {

template <class Port>
class shard;

/// The shard's batched pushes (a friend of it): batch_ops (server/batch.hpp) derives from it.
template <class Port>
struct batch_push_ops : batch_lookup<Port> {
  using shard_t = shard<Port>;
  using slice = key_slice<Port>;
  using planned = planned_slice<slice>;

  /// batch_push: each key's value from the payload, as a push of a whole key (numbered by its
  /// entry's aux): summed into the key's sync round, or applied now (dist_async). Answered once
  /// every key's round completed (at once in dist_async).
  static void push(shard_t& sh, int rank, const Port& from, const wire::header& h,
                   std::string_view meta, std::span<const std::byte> payload) {
    const auto entries = wire::decode_batch(meta, h.key, h.total);
    check_payload(h, entries.size(), h.total * wire::dtype_size(h.type), payload.size());
    // flag_each: key i is answered on its own, by a response to req_id + i.
    const bool each = (h.flags & wire::flag_each) != 0;
    if (each && h.req_id > std::numeric_limits<std::uint64_t>::max() - entries.size())
      throw error(errc::protocol, "a batched push of " + std::to_string(entries.size()) +
                                      " keys answered each past the last request id");
    auto& found = sh.batch_slices_;
    // Key i may be pushed in this frame: not twice in its round.
    auto check = [&](const slice& s, const wire::batch_entry& e) {
      if (sh.cfg_.sync && !s.duplicate(rank, e.aux) && s.round_done.count(rank))
        throw error(errc::protocol, "worker " + std::to_string(rank) + " pushed key " +
                                        shard_t::key_str(e.key) + " twice in round " +
                                        std::to_string(s.round));
    };
    // The only worker in the group: each key's round is this push alone, applied at once
    // (what the round would do, without its merge buffer and waiters).
    const bool alone = sh.cfg_.sync && sh.active_workers() == 1;
    // What the pass reads of each slice: alone, a push reads half the lines of one in a round.
    const std::size_t walk_bytes = alone ? slice_lone_push_bytes : slice_hot_bytes;
    std::uint32_t id = no_batch;  // the frame's countdown (not each)
    // Key i's push is answered: now (each), or with the frame's countdown.
    auto answered = [&](std::size_t i) {
      if (each) sh.answer(from, h.req_id + i, errc::ok, {}, /*each=*/true);
    };
    with_dtype(h.type, [&]<class T>() {
      // Keys [lo, hi)'s pushes, the first one's value at `value`. On a pool thread (`fx`:
      // pass_effects<Port>*) what only the io thread may do is left in fx: there are no held
      // pulls then, and no key is answered alone. On the io thread fx is nullptr, an instance of
      // its own without the pool's cases, and the loop is inside: a key's push shared by both
      // and called per key cost 20-45 instructions a key more (callgrind).
      auto push_keys = [&](std::size_t lo, std::size_t hi, const T* value, auto fx) {
        constexpr bool on_pool = !std::is_same_v<decltype(fx), std::nullptr_t>;
        const bool may_cut = !on_pool;  // a pool thread cuts no large value over the pool
        for (std::size_t i = lo; i < hi; value += found[i]->size(), ++i) {
          // Not past the run: another thread's slices.
          prefetch_ahead(found, entries, sizeof(T), i, hi, walk_bytes);
          slice& s = *found[i];
          const std::uint64_t n = s.size(), seq = entries[i].aux;
          if (s.duplicate(rank, seq)) {  // re-sent after a restart: applied before
            answered(i);
            continue;
          }
          if (sh.cfg_.sync && !(alone && s.cov.empty())) {
            sh.begin_round_push(s, rank);
            sh.math_.template contribute<T>(s, 0, value, n, may_cut);
            if (each) {
              sh.end_round_push(s, rank, reply_to<Port>{from, h.req_id + i, no_batch, true}, seq);
              continue;
            }
            if constexpr (on_pool)
              ++fx->waits;
            else
              sh.waits_.add(id);
            sh.end_round_push(s, rank, reply_to<Port>{Port{}, 0, id}, seq, fx);
            continue;
          }
          if (sh.cfg_.sync) {  // alone: the round is this push, applied at once
            sh.math_.template apply_range<T>(s, value, 0, n, /*new_step=*/true, may_cut);
            if (seq) s.applied.set(rank, std::max(s.applied.get(rank), seq));
          } else {  // dist_async
            bool first = true;
            if (s.take_async_frame(rank, seq, true, first))
              sh.math_.template apply_range<T>(s, value, 0, n, first, may_cut);
            s.parts.erase(rank);
            if (seq) s.applied.set(rank, seq);
          }
          ++s.round;  // the slice's version: rounds applied, or pushes applied in dist_async
          if constexpr (on_pool) {
            ++fx->changes;
          } else {
            sh.changed();
            sh.release_held(s);
            answered(i);
          }
        }
      };
      const T* values = reinterpret_cast<const T*>(payload.data());
      // No key can be refused as pushed twice in its round while no round holds a push of this
      // worker: then a planned frame's first pass reads no slice (find_slices).
      const bool may_refuse = sh.cfg_.sync && sh.open_pushes(rank) != 0;
      if (const std::vector<planned>* plan = plan_for_runs<T>(sh, h, entries, each)) {
        sh.refuse_if_left(rank, entries[0].key);
        guard g(sh);
        id = sh.waits_.open(from, h.req_id);
        if (push_in_runs<T>(sh, *plan, entries, id, values, check, may_refuse, push_keys))
          return sh.waits_.done(id, errc::ok, {}, sh);
        sh.waits_.drop(id);  // a key failed its run's check: checked again below, in order
      }
      try {
        sh.refuse_if_left(rank, entries[0].key);
        find_slices(sh, h, entries, check, may_refuse);
      } catch (const error& e) {
        // A refused frame answered each: every key's push gets the refusal (a protocol error
        // closes the connection instead).
        if (!each || e.code() == make_error_code(errc::protocol)) throw;
        const auto code = static_cast<errc>(e.code().value());
        for (std::size_t i = 0; i < entries.size(); ++i)
          sh.answer(from, h.req_id + i, code, e.what());
        return;
      }
      guard g(sh);
      id = each ? no_batch : sh.waits_.open(from, h.req_id);
      push_keys(0, found.size(), values, nullptr);
      if (!each) sh.waits_.done(id, errc::ok, {}, sh);
    });
  }

 protected:
  using batch_lookup<Port>::check_payload;
  using batch_lookup<Port>::find_slices;
  using batch_lookup<Port>::follow_plan;
  using batch_lookup<Port>::prefetch_ahead;
  using typename batch_lookup<Port>::guard;

 private:
  // A batched push of at least twice this many keys is served on the apply pool's threads, a
  // run of at least this many consecutive keys each (at ~0.3 us a key, a run is worth waking a
  // thread for; a frame holds at most client/batch.hpp's 4,096 keys, so up to four runs).
  static constexpr std::size_t parallel_batch_keys = 1024;
  // ... and only with threads to spare: server_threads set to 2 or more, or left to the cores
  // (0) on a machine of at least this many. (On two cores that also run the workers, two
  // threads measured 3-5% slower: the workers' threads want the second core.)
  static constexpr unsigned parallel_batch_cores = 4;
  static bool batches_on_pool(unsigned server_threads) {
    return server_threads ? server_threads >= 2
                          : apply_pool::threads_for(0) >= parallel_batch_cores;
  }

  // The plan of a push frame whose keys go to the pool (push_in_runs), or nullptr: a frame seen
  // before (its slices planned: frame_plans) of enough keys, where nothing a key does needs the
  // io thread (no key answered alone, no held pull or kept-back request to release, no dead
  // worker to fail) or runs on one thread only (an optimizer that is not element-wise: an
  // element-wise one already updates a large value on several threads at once).
  template <class T>
  static const std::vector<planned>* plan_for_runs(shard_t& sh, const wire::header& h,
                                                   const wire::batch_entries& entries, bool each) {
    if (each || entries.size() < 2 * parallel_batch_keys || !batches_on_pool(sh.cfg_.apply_threads))
      return nullptr;
    if (!sh.held_.empty() || !sh.parked_.empty() || !sh.dead_.empty()) return nullptr;
    const auto& upd = sh.math_.template updater<T>();
    if (upd && !upd.elementwise) return nullptr;
    return sh.plans_.find(entries, h.type, sh.slices_.frees());
  }

  // Serves a planned frame's keys in runs of consecutive keys, each run on a thread of its own
  // (apply_pool::run_parts: the same thread for the same run every round, so its slices stay in
  // its cache), in two steps: every run checks its keys against the plan and, when
  // `may_refuse`, check(slice, entry) (follow_plan); all wait for all, and only if every key passed
  // does each run push its keys with push_keys(lo, hi, value, fx); no two threads touch one slice.
  // Then, on the io thread, what the runs left, in key order: the countdown grows by the keys that
  // wait, the changes are counted, and the rounds that completed are answered (no held pull or
  // kept-back request waits on them: plan_for_runs). False, nothing changed, when a key failed its
  // check (the caller checks the frame again, key by key, and refuses it naming the first bad key).
  // A key that throws while pushed ends its run; the others' effects still count, and the first
  // exception is rethrown after.
  template <class T, class Check, class PushKeys>
  static bool push_in_runs(shard_t& sh, const std::vector<planned>& plan,
                           const wire::batch_entries& entries, std::uint32_t id, const T* values,
                           Check& check, bool may_refuse, PushKeys& push_keys) {
    auto& found = sh.batch_slices_;
    const std::size_t n = entries.size();
    found.resize(n);
    apply_pool& pool = sh.math_.pool();
    const auto parts =
        static_cast<unsigned>(std::min<std::size_t>(pool.threads(), n / parallel_batch_keys));
    auto first_of = [&](unsigned p) { return n * p / parts; };
    std::vector<const T*> value_of(parts);  // where run p's first value starts
    std::uint64_t at = 0;
    for (std::size_t k = 0, p = 0; p < parts; ++p) {
      for (; k < first_of(static_cast<unsigned>(p)); ++k) at += entries[k].elements;
      value_of[p] = values + at;
    }
    std::atomic<bool> bad{false};
    part_barrier checked(parts);
    std::mutex m;
    std::vector<std::pair<std::uint64_t, pass_effects<Port>>> runs;
    std::exception_ptr failed;
    try {
      pool.run_parts(parts, [&](unsigned p) {
        const std::size_t lo = first_of(p), hi = first_of(p + 1);
        try {
          if (!follow_plan(plan, entries, lo, hi, check, may_refuse, slice_hot_bytes, found))
            bad = true;
        } catch (...) {
          bad = true;
        }
        checked.arrive_and_wait();
        if (bad) return;
        pass_effects<Port> fx;
        auto keep = [&] {
          std::lock_guard lk(m);
          runs.emplace_back(lo, std::move(fx));
        };
        try {
          push_keys(lo, hi, value_of[p], &fx);
        } catch (...) {
          keep();
          throw;
        }
        keep();
      });
    } catch (...) {
      failed = std::current_exception();
    }
    if (bad) return false;
    std::sort(runs.begin(), runs.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::uint64_t changes = 0;
    for (auto& r : runs) {
      changes += r.second.changes;
      if (r.second.waits) sh.waits_.add(id, r.second.waits);
      for (std::size_t w = 0; w < r.second.open_pushes.size(); ++w)
        if (r.second.open_pushes[w])
          sh.count_open_pushes(static_cast<int>(w), r.second.open_pushes[w]);
    }
    sh.changed_by(changes);
    for (auto& r : runs) {
      for (auto [request, keys] : r.second.batches) sh.waits_.done(request, errc::ok, {}, sh, keys);
      for (auto& w : r.second.answers) sh.release(w, errc::ok, {});
    }
    if (failed) std::rethrow_exception(failed);
    return true;
  }
};

}  // namespace kvstore::detail
