// A shard's batched requests (issue 12): one frame naming many small keys (wire::decode_batch),
// each a whole key slice, served in one pass over its keys: inits, pushes (summed into each
// key's sync round, or applied at once in dist_async) and pulls (the values one after the other
// in data frames). Every key of a frame is checked before anything changes, so a bad one refuses
// the frame whole, naming the key. A request is answered once, when all its keys are done: a
// countdown per request (batch_waits), not a waiter per key that allocates. A push of many keys
// is served in runs of keys on the apply pool's threads where the machine has cores to spare
// (push_in_runs). The shard (server/shard.hpp) keeps the rules; this file applies them key
// after key.
#pragma once

#include <kvstore/detail/prefetch.hpp>
#include <kvstore/error.hpp>
#include <kvstore/server/apply_pool.hpp>
#include <kvstore/server/frame_plans.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/server/value_answers.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
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

/// Batched requests waiting for their keys (a sync round to complete, rank 0's init), each a
/// countdown that answers its request when it reaches 0, with the first error of its keys if
/// any. Entries are reused: none is allocated per key.
template <class Port>
class batch_waits {
 public:
  /// A countdown for request `req_id` of `port`, held open (it cannot reach 0) until the
  /// frame's keys are all queued: done(id) once more closes it.
  std::uint32_t open(const Port& port, std::uint64_t req_id) {
    std::uint32_t id = free_;
    if (id == no_batch) {
      id = static_cast<std::uint32_t>(e_.size());
      e_.emplace_back();
    } else {
      free_ = e_[id].next_free;
    }
    entry& e = e_[id];
    e.port = port;
    e.req_id = req_id;
    e.remaining = 1;
    e.status = errc::ok;
    e.message.clear();
    ++used_;
    return id;
  }
  /// `n` more keys of request `id` wait.
  void add(std::uint32_t id, std::uint64_t n = 1) { e_[id].remaining += n; }
  /// `keys` keys of request `id` are done (`status` ok, or its error: the first one is
  /// answered). The last answers the request through `sh.answer`.
  template <class Shard>
  void done(std::uint32_t id, errc status, const std::string& message, Shard& sh,
            std::uint64_t keys = 1) {
    entry& e = e_[id];
    if (status != errc::ok && e.status == errc::ok) {
      e.status = status;
      e.message = message;
    }
    if (e.remaining -= keys) return;
    Port port = std::move(e.port);
    e.port = Port{};
    const std::uint64_t req = e.req_id;
    const errc st = e.status;
    std::string msg = std::move(e.message);
    e.next_free = free_;
    free_ = id;
    --used_;
    sh.answer(port, req, st, std::move(msg));
  }
  /// Forgets request `id` unanswered (a frame about to be checked and served again).
  void drop(std::uint32_t id) {
    entry& e = e_[id];
    e.port = Port{};
    e.message.clear();
    e.next_free = free_;
    free_ = id;
    --used_;
  }
  /// Requests waiting.
  std::size_t size() const noexcept { return used_; }
  /// Forgets them all (the shard's slices were replaced).
  void clear() {
    e_.clear();
    free_ = no_batch;
    used_ = 0;
  }

 private:
  struct entry {
    Port port;
    std::uint64_t req_id = 0;
    std::uint64_t remaining = 0;
    errc status = errc::ok;
    std::string message;
    std::uint32_t next_free = no_batch;
  };
  std::vector<entry> e_;
  std::uint32_t free_ = no_batch;
  std::size_t used_ = 0;
};

/// What the pushes of a run of a batched frame's keys leave to the io thread when the run is
/// served on an apply pool thread (batch_ops::push): the changes to report, how many keys now
/// wait on the frame's countdown, and the waiters of the rounds that completed, answered on the
/// io thread once every run is done: those of batched requests counted per request (a run
/// completes thousands of rounds for the same two or three), the others one by one.
template <class Port>
struct pass_effects {
  std::uint64_t changes = 0;
  std::uint64_t waits = 0;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> batches;  // (request, keys done)
  std::vector<reply_to<Port>> answers;
  std::vector<std::int64_t> open_pushes;  // per worker: pushes put in open rounds, less closed

  /// Round waiter `w` is answered ok.
  void release(reply_to<Port>&& w) {
    if (w.batch == no_batch) return answers.push_back(std::move(w));
    for (auto& b : batches)
      if (b.first == w.batch) return void(++b.second);
    batches.emplace_back(w.batch, 1);
  }
};

/// The shard's batched requests (a friend of it: the rules are the shard's).
template <class Port>
struct batch_ops {
  using shard_t = shard<Port>;
  using slice = key_slice<Port>;
  using planned = planned_slice<slice>;

  /// batch_init: the named keys' slices (whole keys, on this server), created if new, their
  /// value stored from the payload (rank 0: flag_has_data). Answered once every key has a value.
  static void init(shard_t& sh, int rank, const Port& from, const wire::header& h,
                   std::string_view meta, std::span<const std::byte> payload) {
    const auto entries = wire::decode_batch(meta, h.key, h.total);
    if (h.type != wire::dtype::f32 && h.type != wire::dtype::f64)
      throw error(errc::invalid_argument, "a batched init of " + std::to_string(entries.size()) +
                                              " keys without an element type");
    const std::size_t elem = wire::dtype_size(h.type);
    const bool with_data = (h.flags & wire::flag_has_data) != 0;
    check_payload(h, entries.size(), with_data ? h.total * elem : 0, payload.size());
    // Every key checked, and the new ones counted, before anything changes.
    auto& found = sh.batch_slices_;
    found.assign(entries.size(), nullptr);
    const std::uint64_t stamp = ++sh.batch_stamp_;
    std::uint64_t new_keys = 0, new_bytes = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      prefetch_lookup(sh, entries, i);
      const wire::batch_entry e = entries[i];
      const std::uint64_t n = e.elements, rl = e.aux;
      if ((rl && n % rl) || n > sh.cfg_.max_key_bytes / elem)
        throw error(errc::invalid_argument, "key " + shard_t::key_str(e.key) +
                                                ": a batched init of " + std::to_string(n) +
                                                " elements (row length " + std::to_string(rl) +
                                                ") that cannot be a slice here (max_key_bytes " +
                                                std::to_string(sh.cfg_.max_key_bytes) + ")");
      slice* existing = sh.slices_.find_value(e.key);
      if (!existing) {
        ++new_keys;
        new_bytes += n * elem + shard_t::key_overhead_bytes;
        continue;
      }
      slice& s = *existing;
      named_once(s, stamp);
      if (s.type != h.type || s.total != n || s.lo != 0 || s.hi != n || s.row_length != rl)
        throw error(errc::size_mismatch, "key " + shard_t::key_str(e.key) + ": init with " +
                                             std::to_string(n) + " elements (row length " +
                                             std::to_string(rl) + ") but it was inited with " +
                                             std::to_string(s.total) + " (row length " +
                                             std::to_string(s.row_length) + ")");
      if (!(s.restored && s.inited) && (s.init_done.count(rank) || (with_data && s.inited)))
        throw error(errc::already_inited, "key " + shard_t::key_str(e.key) + " is already inited");
      found[i] = &s;
    }
    admit(sh, entries, new_keys, new_bytes);
    create_new(sh, h, entries, stamp, new_bytes);

    guard g(sh);
    const std::uint32_t id = sh.waits_.open(from, h.req_id);
    const std::byte* src = payload.data();
    bool stored = false;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      slice& s = *found[i];
      const std::size_t bytes = entries[i].elements * elem;
      if (s.restored && s.inited) {  // re-sent after a restart: answered, not refused
        src += with_data ? bytes : 0;
        continue;
      }
      s.init_done.insert(rank);
      if (with_data) {
        std::memcpy(s.value.data(), src, bytes);
        src += bytes;
        s.inited = true;
        stored = true;
        sh.release_all(s.init_waiters, errc::ok, {});
      } else if (!s.inited) {
        s.init_waiters.push_back({Port{}, 0, id});
        sh.waits_.add(id);
      }
    }
    if (stored) sh.changed(true);
    sh.waits_.done(id, errc::ok, {}, sh);
  }

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

  /// batch_pull: the keys' values one after the other, in data frames of at most chunk_bytes
  /// flagged flag_batch. A batched pull is never held: one that would wait (a slower worker
  /// under bounded staleness) is refused, unsupported, and the worker pulls those keys one by
  /// one.
  static void pull(shard_t& sh, int rank, const Port& from, const wire::header& h,
                   std::string_view meta) {
    const auto entries = wire::decode_batch(meta, h.key, h.total);
    const std::size_t elem = wire::dtype_size(h.type);
    if (!elem || h.total > sh.cfg_.max_frame_bytes / elem)
      throw error(errc::invalid_argument,
                  "a batched pull of " + std::to_string(entries.size()) + " keys and " +
                      std::to_string(h.total) + " elements: more than max_frame_bytes (" +
                      std::to_string(sh.cfg_.max_frame_bytes) + ") in one answer");
    find_slices(
        sh, h, entries,
        [&](const slice& s, const wire::batch_entry&) {
          if (!sh.may_answer(rank, s, 0))
            throw error(errc::unsupported, "key " + shard_t::key_str(s.key) +
                                               ": a batched pull cannot wait for slower workers "
                                               "(staleness); pull it alone");
        },
        sh.gate().may_lag(), slice_pull_bytes);
    const auto& found = sh.batch_slices_;
    auto buf = std::make_shared<bytes>(h.total * elem);
    std::byte* at = buf->data();
    for (std::size_t i = 0; i < entries.size(); ++i) {
      prefetch_ahead(found, entries, elem, i, found.size(), slice_pull_bytes);
      const slice& s = *found[i];
      std::memcpy(at, s.value.data(), s.value.size());
      at += s.value.size();
    }
    using answers = value_answers<Port>;
    answers::send_frames(from, answers::data_header(h, h.total, h.type), buf->data(), h.total, elem,
                         0, wire::flag_batch, buf, sh.cfg_.chunk_bytes);
  }

 private:
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

  // The new keys of a batched init fit max_keys and max_total_bytes (shard::admit_new_slice).
  static void admit(shard_t& sh, const wire::batch_entries& entries, std::uint64_t keys,
                    std::uint64_t bytes) {
    if (!keys) return;
    const auto& c = sh.cfg_;
    auto first_new = [&] {
      for (std::size_t i = 0; i < entries.size(); ++i)
        if (!sh.slices_.count(entries[i].key)) return shard_t::key_str(entries[i].key);
      return std::string("?");
    };
    if (keys > c.max_keys || sh.slices_.size() > c.max_keys - keys)
      throw error(errc::invalid_argument,
                  "key " + first_new() + ": " + std::to_string(keys) + " new keys would take " +
                      sh.who_ + " past its max_keys (" + std::to_string(c.max_keys) +
                      ", KVSTORE_MAX_KEYS; " + std::to_string(sh.slices_.size()) + " held)");
    if (c.max_total_bytes &&
        (bytes > c.max_total_bytes || sh.held_bytes_ > c.max_total_bytes - bytes))
      throw error(errc::invalid_argument,
                  "key " + first_new() + ": " + std::to_string(bytes) + " more bytes would take " +
                      sh.who_ + " past its max_total_bytes (" + std::to_string(c.max_total_bytes) +
                      ", KVSTORE_MAX_TOTAL_BYTES; " + std::to_string(sh.held_bytes_) + " held)");
  }

  // Makes the slices of the keys not found (found[i] == nullptr). A new key named twice is
  // found made already by this frame: the slices made are removed again and the frame refused.
  static void create_new(shard_t& sh, const wire::header& h, const wire::batch_entries& entries,
                         std::uint64_t stamp, std::uint64_t added) {
    auto& found = sh.batch_slices_;
    const std::uint64_t made_here = stamp + 1;  // marks the slices made here, until the end
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (found[i]) continue;
      const wire::batch_entry e = entries[i];
      auto [it, fresh] = sh.slices_.try_emplace(e.key);
      if (!fresh) {
        for (std::size_t j = 0; j < i; ++j)
          if (found[j] && found[j]->batch_stamp == made_here) sh.slices_.erase(found[j]->key);
        throw error(errc::protocol,
                    "key " + shard_t::key_str(e.key) + " named twice in one batched request");
      }
      slice& s = it->second;
      s.key = e.key;
      s.type = h.type;
      s.total = e.elements;
      s.lo = 0;
      s.hi = e.elements;
      s.row_length = e.aux;
      s.value = slice_value(e.elements * wire::dtype_size(h.type));
      s.batch_stamp = made_here;
      found[i] = &s;
    }
    for (auto* s : found) s->batch_stamp = stamp;
    sh.held_bytes_ += added;
  }
};

}  // namespace kvstore::detail
