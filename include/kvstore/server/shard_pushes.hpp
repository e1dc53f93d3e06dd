// A shard's pushes, plain, compressed or rows: in dist_sync summed into the key's round, applied
// once every worker's push is in (failed when one died), then the requests kept back behind the
// round served; in dist_async applied as they come. Rounds and kept-back requests are here with
// the pushes because a kept-back push is served as a push, and may complete a round in turn.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/server/batch_waits.hpp>
#include <kvstore/server/parked.hpp>
#include <kvstore/server/request_checks.hpp>
#include <kvstore/server/shard_pulls.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/server/slice_math.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/frame.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace kvstore::detail {

/// The layer of shard<Port> (server/shard.hpp) that takes pushes and completes rounds.
template <class Port>
class shard_pushes : public shard_pulls<Port> {
 public:
  using shard_pulls<Port>::shard_pulls;
  using typename shard_pulls<Port>::slice;
  using shard_pulls<Port>::key_str;
  using shard_pulls<Port>::pull;

  /// One frame of a push: elements [h.offset, h.offset + n) of the key. h.aux is the worker's
  /// sequence number of the push (0: not numbered), flag_last marks its last frame.
  void push(int rank, const Port& from, const wire::header& h, std::span<const std::byte> payload) {
    if (parks(rank, h)) return park(rank, from, h, {}, payload);
    if (wire::encoding_bits(h.flags)) return push_encoded(rank, from, h, payload);
    refuse_if_left(rank, h.key);
    slice& s = find(h);
    const std::uint64_t n = checks::check_range(s, h, payload.size());
    if (s.duplicate(rank, h.aux)) return ack_duplicate(from, h);
    const std::uint64_t rel = h.offset - s.lo;
    if (cfg_.sync) {
      begin_round_push(s, rank);
      with_dtype(s.type, [&]<class T>() {
        math_.template contribute<T>(s, rel, reinterpret_cast<const T*>(payload.data()), n);
      });
      if (h.flags & wire::flag_last) end_round_push(s, rank, from, h);
      return;
    }
    bool first = true;
    if (s.take_async_frame(rank, h.aux, (h.flags & wire::flag_last) != 0, first))
      with_dtype(s.type, [&]<class T>() {
        math_.template apply_range<T>(s, reinterpret_cast<const T*>(payload.data()), rel, n,
                                      /*new_step=*/first);
      });
    end_async_frame(s, rank, from, h);
  }

  /// One frame of a compressed push (the encoding in its flags, wire/encoding.hpp): decoded as
  /// it is summed into the round (sync) or before it is applied (async). Values and optimizer
  /// state stay in full precision.
  void push_encoded(int rank, const Port& from, const wire::header& h,
                    std::span<const std::byte> payload) {
    refuse_if_left(rank, h.key);
    slice& s = find(h);
    const wire::encoding e = checks::known_encoding(h, "push");
    with_dtype(s.type, [&]<class T>() {
      wire::payload_view<T> v;
      try {
        v = wire::view_payload<T>(e, payload);
      } catch (const error& bad) {
        throw error(errc::protocol, "key " + key_str(h.key) + ": " + bad.what());
      }
      const std::uint64_t n = checks::check_elements(s, h, v.count);
      if (s.duplicate(rank, h.aux)) return ack_duplicate(from, h);
      const std::uint64_t rel = h.offset - s.lo;
      if (cfg_.sync) {
        begin_round_push(s, rank);
        T* m = reinterpret_cast<T*>(s.merge.data());
        s.cov.contribute(
            rel, rel + n,
            [&](std::uint64_t b, std::uint64_t end) { v.copy_to(b - rel, end - b, m + b); },
            [&](std::uint64_t b, std::uint64_t end) { v.add_to(b - rel, end - b, m + b); });
        if (h.flags & wire::flag_last) end_round_push(s, rank, from, h);
        return;
      }
      bool first = true;
      if (s.take_async_frame(rank, h.aux, (h.flags & wire::flag_last) != 0, first)) {
        if (scratch_.size() < n * sizeof(T)) scratch_.resize(n * sizeof(T));
        T* grad = reinterpret_cast<T*>(scratch_.data());
        v.copy_to(0, n, grad);
        math_.template apply_range<T>(s, grad, rel, n, /*new_step=*/first);
      }
      end_async_frame(s, rank, from, h);
    });
  }

  /// A push of rows: meta lists the row ids, the payload holds one row per id.
  void push_rows(int rank, const Port& from, const wire::header& h, std::string_view meta,
                 std::span<const std::byte> payload) {
    refuse_if_left(rank, h.key);
    slice& s = find(h);
    auto rows = checks::check_rows(s, h, meta);
    if (s.duplicate(rank, h.aux)) return ack_duplicate(from, h);
    const std::uint64_t rl = s.row_length;
    if (payload.size() != rows.size() * rl * s.elem())
      throw error(errc::size_mismatch, "key " + key_str(h.key) + ": " +
                                           std::to_string(rows.size()) + " rows need " +
                                           std::to_string(rows.size() * rl) + " values");
    if (cfg_.sync) {
      begin_round_push(s, rank);
      with_dtype(s.type, [&]<class T>() {
        const T* src = reinterpret_cast<const T*>(payload.data());
        for (std::size_t i = 0; i < rows.size(); ++i)
          math_.template contribute<T>(s, static_cast<std::uint64_t>(rows[i]) * rl - s.lo,
                                       src + i * rl, rl);
      });
      if (h.flags & wire::flag_last) end_round_push(s, rank, from, h);
      return;
    }
    // Async: duplicates in one message are summed first, then each row applied.
    bool first = true;
    if (s.take_async_frame(rank, h.aux, (h.flags & wire::flag_last) != 0, first))
      with_dtype(s.type, [&]<class T>() {
        const T* src = reinterpret_cast<const T*>(payload.data());
        std::map<std::int64_t, std::vector<T>> sum;
        for (std::size_t i = 0; i < rows.size(); ++i) {
          auto [it, fresh] = sum.try_emplace(rows[i], src + i * rl, src + (i + 1) * rl);
          if (!fresh)
            for (std::uint64_t j = 0; j < rl; ++j) it->second[j] += src[i * rl + j];
        }
        for (auto& [r, v] : sum) {
          math_.template apply_range<T>(s, v.data(), static_cast<std::uint64_t>(r) * rl - s.lo, rl,
                                        first);
          first = false;
        }
      });
    end_async_frame(s, rank, from, h);
  }

 protected:
  using typename shard_pulls<Port>::checks;
  using shard_pulls<Port>::changed;
  using shard_pulls<Port>::release_all;
  using shard_pulls<Port>::ack;
  using shard_pulls<Port>::find;
  using shard_pulls<Port>::refuse_if_left;
  using shard_pulls<Port>::count_open_pushes;
  using shard_pulls<Port>::parks;
  using shard_pulls<Port>::park;
  using shard_pulls<Port>::cfg_;
  using shard_pulls<Port>::math_;
  using shard_pulls<Port>::left_;
  using shard_pulls<Port>::dead_;
  using shard_pulls<Port>::scratch_;
  using shard_pulls<Port>::held_;
  using shard_pulls<Port>::parked_;
  using shard_pulls<Port>::serving_parked_;
  using shard_pulls<Port>::release_held;

  void begin_round_push(slice& s, int rank) {
    refuse_if_left(rank, s.key);
    if (s.round_done.count(rank)) refuse_twice(s, rank);
    if (s.merge.size() != s.size() * s.elem()) s.merge = slice_value(s.size() * s.elem());
  }
  [[noreturn]] static void refuse_twice(const slice& s, int rank) {
    throw error(errc::protocol, "worker " + std::to_string(rank) + " pushed key " + key_str(s.key) +
                                    " twice in round " + std::to_string(s.round));
  }

  void end_round_push(slice& s, int rank, const Port& from, const wire::header& h) {
    end_round_push(s, rank, reply_to<Port>{from, h.req_id, no_batch, /*each=*/true}, h.aux);
  }
  // Worker `rank`'s push number `seq` of the round is in: `to` is answered when the round
  // completes. On a pool thread (`fx`), what the io thread must do is left in `fx`.
  void end_round_push(slice& s, int rank, reply_to<Port> to, std::uint64_t seq,
                      pass_effects<Port>* fx = nullptr) {
    s.round_seq.set(rank, seq);
    if (s.round_done.insert(rank)) count_open_pushes(rank, 1, fx);
    s.round_waiters.push_back(std::move(to));
    if (!dead_.empty()) check_dead(s);
    if (!s.round_waiters.empty()) maybe_complete(s, fx);
  }

  // After each frame of an async push: on its last, the push is applied whole and answered.
  void end_async_frame(slice& s, int rank, const Port& from, const wire::header& h) {
    if (!(h.flags & wire::flag_last)) return;
    s.parts.erase(rank);
    if (h.aux) s.applied.set(rank, h.aux);
    ++s.round;  // the slice's version in dist_async: pushes applied (exactly once each)
    changed();  // a snapshot due now is written before the answer: an answered push is kept
    ack(from, h.req_id);
    release_held(s);
  }

  // A push re-sent after a restart that the snapshot already holds: answered, not applied twice.
  static void ack_duplicate(const Port& from, const wire::header& h) {
    if (h.flags & wire::flag_last) ack(from, h.req_id);
  }

  bool round_complete(const slice& s) const { return s.round_done.covers(cfg_.num_workers, left_); }

  // The round of `s` is over (applied or failed): its workers' pushes are no longer open.
  void close_round(slice& s, pass_effects<Port>* fx = nullptr) {
    s.round_done.for_each([&](int r) { count_open_pushes(r, -1, fx); });
    s.round_done.clear();
  }

  // Applies the round of `s` if every worker's push is in. On a pool thread (`fx`), the change
  // and the answers are left to the io thread (batch_ops::push_in_runs).
  void maybe_complete(slice& s, pass_effects<Port>* fx = nullptr) {
    if (!round_complete(s)) return;
    with_dtype(s.type, [&]<class T>() { math_.template apply_round<T>(s, /*may_cut=*/!fx); });
    s.cov.clear();
    close_round(s, fx);
    s.round_seq.for_each(
        [&](int r, std::uint64_t q) { s.applied.set(r, std::max(s.applied.get(r), q)); });
    s.round_seq.clear();
    ++s.round;
    if (fx) {  // no held pull or kept-back request waits (batch_ops::plan_for_runs)
      ++fx->changes;
      for (auto& w : s.round_waiters) fx->release(std::move(w));
      s.round_waiters.clear();
      return;
    }
    changed();
    release_all(s.round_waiters, errc::ok, {});
    // (Both are rare: tested here, inline, on every round of every key.)
    if (!held_.empty()) release_held(s);
    if (!parked_.empty()) serve_parked(s);
  }

  void check_dead(slice& s) {
    int dead = -1;
    dead_.for_each([&](int r) {
      if (dead < 0 && !left_.count(r)) dead = r;
    });
    if (dead >= 0)
      fail_round(s, "worker " + std::to_string(dead) + " (node " + std::to_string(worker_id(dead)) +
                        ") is dead");
  }

  void fail_round(slice& s, const std::string& why) {
    release_all(s.round_waiters, errc::node_dead,
                "sync round " + std::to_string(s.round) + " of key " + key_str(s.key) +
                    " cannot complete: " + why);
    close_round(s);
    s.round_seq.clear();
    s.cov.clear();
    serve_parked(s);
  }

  // The round of `s` completed or failed: each worker's kept-back requests of its key are
  // served in arrival order until one must wait again (a push of the next round is in). A
  // request served here may complete a round itself; that round's call finds this one at work,
  // and this loop goes on until no worker's next request may be served.
  void serve_parked(slice& s) {
    if (parked_.empty() || s.serving_parked) return;
    s.serving_parked = true;
    for (bool progress = true; progress;) {
      progress = false;
      for (int rank : parked_.ranks_of(s.key))
        while (!s.round_done.count(rank)) {
          auto r = parked_.take_first(s.key, rank);
          if (!r) break;
          progress = true;
          serve_one(rank, *r);
        }
    }
    s.serving_parked = false;
  }

  void serve_one(int rank, const parked_request<Port>& r) {
    serving_parked_ = true;  // served now, not kept back again
    struct reset {
      bool& flag;
      ~reset() { flag = false; }
    } done{serving_parked_};
    try {
      if (r.h.command == wire::cmd::pull)
        pull(rank, r.port, r.h);
      else
        push(rank, r.port, r.h, r.payload);
    } catch (const error& e) {
      r.port.reply(r.h.req_id, static_cast<errc>(e.code().value()), e.what());
    }
  }
};

}  // namespace kvstore::detail
