// A multi-key call (push, pull or init of a std::span<const key>) split for the wire: its small
// keys (plain on the wire, whole on one server) in batches that travel as batched frames
// (client/batch.hpp), the others grouped by key, to go one op per key. Each key is found and
// checked before anything is queued; a call naming the same key list as a recent call of its
// kind follows that call's plan (client/call_plan.hpp) instead of looking each key up. What this
// keeps from call to call, the plans and the numbers that mark a call's records, is guarded by
// one lock of its own. KVStore<dist> (dist.hpp) submits the pieces to its engine.
#pragma once

#include <kvstore/client/batch.hpp>
#include <kvstore/client/call.hpp>
#include <kvstore/client/call_plan.hpp>
#include <kvstore/client/key_record.hpp>
#include <kvstore/client/key_table.hpp>
#include <kvstore/client/requests.hpp>
#include <kvstore/detail/group.hpp>
#include <kvstore/key.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace kvstore::detail {

/// The pieces of one multi-key call: its small keys in batches of at most batch_keys, in the
/// call's order (each key with what its frames need of its record, read while the record is at
/// hand), and the other keys grouped by key.
template <class Buf>
struct split_call {
  /// Keys per batch (one engine op): a call's first batch goes out while the next is queued, and
  /// the buffers of one stay well below what malloc maps afresh per call. A batch's passes (its
  /// engine op, its frames, its pushes' numbers) each read its keys' records: 8,192 records'
  /// first lines (512 KiB) stay in a core's L2 from one pass to the next, where 32,768 (2 MiB)
  /// were read from memory again by each (cachegrind: 9.9 -> 8.2 misses a key per push call).
  /// (A call that follows a plan, step after step, reads none: its engine op renews the last
  /// one's hold, and the push counts are the key table's.)
  static constexpr std::size_t batch_keys = std::size_t{1} << 13;

  std::vector<std::shared_ptr<batch<Buf>>> small;
  bool repeats = false;  // a small key named twice: all small keys go in one batch
  std::vector<key_group<key_record*, Buf>> large;
  // Or a call that follows a plan of distinct keys, all batched: its batches are cut from the
  // plan's entries (and `bufs`) as they are submitted, so the first is on the wire while the
  // next are built, and no lock is held meanwhile.
  std::shared_ptr<const std::vector<call_plans::key_entry>> planned;
  std::shared_ptr<const std::vector<batch_frames>> planned_cuts;  // each batch's frames
  std::span<const Buf> bufs;

  std::size_t batches() const noexcept {
    if (planned) return (planned->size() + batch_keys - 1) / batch_keys;
    return repeats ? 1 : small.size();
  }

  /// The batch of keys lo .. hi - 1 of a planned call (lo a multiple of batch_keys), its
  /// frames cut when the call was planned.
  std::shared_ptr<batch<Buf>> planned_batch(std::size_t lo, std::size_t hi) const {
    const auto& plan = *planned;
    auto b = std::make_shared<batch<Buf>>(0, hi - lo);
    for (std::size_t i = lo; i < hi; ++i)
      b->entries.push_back(
          {plan[i].rec, bufs[i], plan[i].id, plan[i].total, plan[i].server, plan[i].pushes});
    if (planned_cuts)
      b->cut = std::shared_ptr<const batch_frames>(planned_cuts, &(*planned_cuts)[lo / batch_keys]);
    return b;
  }
};

/// Splits a worker's multi-key calls; one per store.
template <class T>
class multi_key_calls {
 public:
  /// What a split call is told of the store besides its keys.
  struct call_context {
    const key_table& keys;
    const requests<T>& reqs;
    const batches<T>& batch;  // cuts a planned call's batches into frames
    /// Small keys may be batched: not a pull a server may hold for slower workers (dist_async
    /// with staleness), which servers hold key by key.
    bool batch_ok = true;
    /// Plans may be followed: not a push once the worker left the group (every key must be
    /// refused then, which the lookup does).
    bool follow_plans = true;
  };

  /// A number for a multi-key call's batch, unique in the store.
  std::uint64_t next_call() {
    std::lock_guard lk(m_);
    return ++calls_;
  }

  /// Every key found and checked before anything is queued, under one hold of the key table:
  /// `checked(record or nullptr, i)` returns key i's record or throws, naming it. A call naming
  /// the same keys as a recent call of its kind skips the lookups: its keys and sizes are
  /// compared with that call's plan, which was checked then.
  template <class Buf, class Checked>
  split_call<Buf> split(call_kind call, std::span<const key> ks, std::span<const Buf> bufs,
                        const call_context& cx, Checked&& checked) {
    constexpr std::size_t batch_keys = split_call<Buf>::batch_keys;
    split_call<Buf> out;
    std::vector<key_record*> large;
    std::vector<Buf> large_bufs;
    const bool pull = call == call_kind::pull;
    // A key's small batch: a new one every batch_keys keys.
    auto batch_of = [&](std::size_t i) -> batch<Buf>& {
      if (out.small.empty() || out.small.back()->size() == batch_keys)
        out.small.push_back(std::make_shared<batch<Buf>>(0, std::min(batch_keys, ks.size() - i)));
      return *out.small.back();
    };
    {
      // The batch marks of the records (key_record::batch_call) and the plans are this lock's.
      std::lock_guard marks(m_);
      auto lk = cx.keys.read_lock();
      call_plans& plans = plans_[pull ? 1 : 0];
      const call_plans::version now{cx.keys.removals_locked(), packed(cx.reqs.store_compression())};
      const auto* followed = cx.follow_plans ? plans.find(ks, bufs, now) : nullptr;
      if (followed && followed->info.all_batched && !followed->info.repeats) {
        out.planned = followed->shared_entries();
        out.planned_cuts = followed->info.cuts;
        out.bufs = bufs;
      } else if (followed) {
        const call_plans::plan& plan = *followed;
        for (std::size_t i = 0; i < ks.size(); ++i) {
          const call_plans::key_entry& e = plan[i];
          if (e.batched) {
            batch_of(i).entries.push_back({e.rec, bufs[i], e.id, e.total, e.server, e.pushes});
          } else {
            large.push_back(e.rec);
            large_bufs.push_back(bufs[i]);
          }
        }
        out.repeats = plan.info.repeats;
      } else {
        call_plans::plan* plan = plans.start(ks, cx.keys.size_locked(), now);
        bool named = false;
        const std::uint64_t stamp = ++calls_;
        for (std::size_t i = 0; i < ks.size(); ++i) {
          cx.keys.prefetch_ahead_locked([&](std::size_t j) { return ks[j].id(); }, i, ks.size());
          const std::uint64_t id = ks[i].id();
          key_record* m = checked(cx.keys.find_locked(id), i);
          const bool batched =
              cx.batch_ok && batches<T>::small(*m) && cx.reqs.travels_plain(*m, pull);
          named = named || ks[i].is_named();
          if (plan) plan->add({m, id, m->total, m->home, batched, m->pushes});
          if (batched) {
            out.repeats = out.repeats || m->batch_call == stamp;
            m->batch_call = stamp;
            batch_of(i).add_distinct(m, id, bufs[i]);
          } else {
            large.push_back(m);
            large_bufs.push_back(bufs[i]);
          }
        }
        if (plan && !named) {  // else never followed
          plans.finish(*plan, out.repeats, batch_keys,
                       [&](std::span<const call_plans::key_entry> es) { return cx.batch.cut(es); });
          // Its batches hold the plan's keys batch for batch: they are sent from the plan's cuts,
          // not cut again.
          if (const auto& cuts = plan->info.cuts)
            for (std::size_t b = 0; b < out.small.size(); ++b)
              out.small[b]->cut = std::shared_ptr<const batch_frames>(cuts, &(*cuts)[b]);
        }
      }
    }
    if (!large.empty())
      out.large = group_by_key<key_record*>(
          std::span<const Buf>(large_bufs), [&](std::size_t i) { return large[i]; },
          [](const key_record* a, const key_record* b) { return a == b; });
    return out;
  }

  /// A call's small keys in one batch, when a key is named twice (its buffers are summed, or
  /// each filled, together): the key's records are marked anew for it.
  template <class Buf>
  std::shared_ptr<batch<Buf>> merged(const split_call<Buf>& c) {
    std::size_t n = 0;
    for (auto& b : c.small) n += b->size();
    std::lock_guard marks(m_);
    auto one = std::make_shared<batch<Buf>>(++calls_, n);
    for (auto& b : c.small)
      for (auto& e : b->entries) one->add(e.rec, e.id, e.buf);
    return one;
  }

 private:
  std::mutex m_;
  std::uint64_t calls_ = 0;  // numbers the calls (under m_)
  call_plans plans_[2];      // recent multi-key pushes' and pulls' keys (under m_)
};

}  // namespace kvstore::detail
