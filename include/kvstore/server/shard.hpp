// One server's shard of the model, without a network: for each key the slice this server owns
// (server/slice.hpp). It takes decoded requests (header, metadata, payload, and a `Port` to
// answer), sums a sync round's pushes of all workers and applies the optimizer once, applies
// async pushes as they come, answers pulls (queued until their round completes; their frames:
// server/value_answers.hpp), and moves optimizer states in and out (their bytes:
// server/states.hpp); a request is checked against its slice by server/request_checks.hpp. The
// node loop (server/server.hpp) feeds it frames and membership; the unit tests
// (tests/unit/test_shard.cpp) feed it by hand.
//
// A Port is a copyable handle to the peer that asked; it may be gone by the time a queued answer
// is sent, and then drops it:
//   void reply(std::uint64_t req_id, errc status, std::string message) const;  // a response
//   void send(wire::header h, std::span<const std::byte> payload,              // any other
//             std::shared_ptr<const void> keep,     // frame; `keep` owns the payload bytes,
//             std::string meta = {}) const;         // `meta` is the frame's text
//   bool same_peer(const Port& other) const;        // both answer the same connection
// Everything runs on one thread (the server's io thread): no locks. Two jobs fan out over the
// apply pool and return before the io thread goes on: a large value's sum or update cut in chunks
// (server/slice_math.hpp, which does the shard's arithmetic), and a large batched push's keys in
// runs (server/batch.hpp), each slice touched by one thread.
//
// Its jobs are layers, each a base of the next: server/shard_core.hpp (the state and the steps
// every request shares), server/shard_setup.hpp (inits, optimizer, states, restore),
// server/shard_pulls.hpp (pulls, held pulls), server/shard_pushes.hpp (pushes, sync rounds, kept-
// back requests); this class adds the entry points: payload sinks, handle, membership changes.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/server/batch.hpp>
#include <kvstore/server/shard_config.hpp>
#include <kvstore/server/shard_core.hpp>
#include <kvstore/server/shard_pulls.hpp>
#include <kvstore/server/shard_pushes.hpp>
#include <kvstore/server/shard_setup.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/frame.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvstore::detail {

template <class Port>
class shard : public shard_pushes<Port> {
 public:
  using shard_pushes<Port>::shard_pushes;
  using typename shard_pushes<Port>::slice;
  using shard_pushes<Port>::key_str;
  using shard_pushes<Port>::init;
  using shard_pushes<Port>::set_optimizer;
  using shard_pushes<Port>::set_key_options;
  using shard_pushes<Port>::save_states;
  using shard_pushes<Port>::load_states;
  using shard_pushes<Port>::pull;
  using shard_pushes<Port>::pull_rows;
  using shard_pushes<Port>::pull_range;
  using shard_pushes<Port>::version;
  using shard_pushes<Port>::push;
  using shard_pushes<Port>::push_rows;

  // ---- requests -------------------------------------------------------------------------------

  /// Where the payload of `h` from worker `rank` is to be read (empty: the caller's buffer).
  /// Checked before the payload is allocated: a frame may only carry as many bytes as its key's
  /// slice (or its command) can take; anything more throws kvstore::error(protocol).
  std::span<std::byte> sink(int rank, const wire::header& h) {
    if (h.payload_len == 0) return {};
    const std::size_t elem = wire::dtype_size(h.type);
    auto too_big = [&](std::uint64_t limit) {
      if (h.payload_len > limit)
        throw error(errc::protocol, "a " + std::to_string(h.payload_len) +
                                        "-byte payload for key " + key_str(h.key) +
                                        " that takes at most " + std::to_string(limit));
    };
    switch (h.command) {
      case wire::cmd::init:
        if (!elem || h.total > cfg_.max_frame_bytes / elem)
          throw error(errc::protocol, "init payload without a valid size");
        too_big(h.total * elem);
        return {};
      case wire::cmd::push:
      case wire::cmd::push_rows: {
        slice* s = slices_.find_value(h.key);
        if (!s || s->type != h.type) {
          too_big(0);  // never inited here: no payload is acceptable
          return {};
        }
        if (h.command == wire::cmd::push && wire::encoding_bits(h.flags))
          return encoded_sink(h, *s);
        too_big(s->size() * s->elem());
        if (h.command == wire::cmd::push) return direct_sink(rank, h, *s);
        return {};
      }
      case wire::cmd::load_states:
        return {};
      case wire::cmd::batch_init:
      case wire::cmd::batch_push:
        // Its entries say what it may carry (decode_batch, checked against the payload before
        // anything changes); the connection's buffer grows as the bytes arrive.
        too_big(cfg_.max_frame_bytes);
        return {};
      default:
        too_big(0);
        return {};
    }
  }

  /// Serves one request of worker `rank`. Throws kvstore::error for a bad request (nothing
  /// changed then); errc::protocol means the peer broke the protocol.
  void handle(int rank, const Port& from, const wire::header& h, std::string_view meta,
              std::span<const std::byte> payload) {
    switch (h.command) {
      case wire::cmd::init:
        return init(rank, from, h, meta, payload);
      case wire::cmd::push:
        if (h.flags & wire::flag_range) checks::refuse_encoded_range(h);
        if (h.flags & wire::flag_range)
          checks::check_range_push(find(h), h, meta, payload.size(), who_);
        return push(rank, from, h, payload);
      case wire::cmd::push_rows:
        return push_rows(rank, from, h, meta, payload);
      case wire::cmd::pull:
        if (h.flags & wire::flag_range) checks::refuse_encoded_range(h);
        if (h.flags & wire::flag_range) return pull_range(rank, from, h, meta);
        return pull(rank, from, h);
      case wire::cmd::pull_rows:
        return pull_rows(rank, from, h, meta);
      case wire::cmd::version:
        return version(from, h);
      case wire::cmd::set_optimizer:
        return set_optimizer(from, h, meta);
      case wire::cmd::save_states:
        return save_states(from, h);
      case wire::cmd::load_states:
        return load_states(from, h, meta, payload);
      case wire::cmd::key_options:
        return set_key_options(from, h, meta);
      case wire::cmd::batch_init:
        return batch_ops<Port>::init(*this, rank, from, h, meta, payload);
      case wire::cmd::batch_push:
        return batch_ops<Port>::push(*this, rank, from, h, meta, payload);
      case wire::cmd::batch_pull:
        return batch_ops<Port>::pull(*this, rank, from, h, meta);
      default:
        throw error(errc::protocol,
                    "unexpected command " + std::to_string(static_cast<int>(h.command)));
    }
  }

  // ---- membership -----------------------------------------------------------------------------

  /// Worker `rank` pushes no more: rounds waiting only for it complete. False if it had left.
  bool worker_left(int rank) {
    if (rank < 0 || !left_.insert(rank)) return false;
    for (auto& [k, s] : slices_)
      if (!s.round_waiters.empty()) maybe_complete(s);
    release_all_held();  // it no longer holds faster workers back
    return true;
  }

  /// Worker `rank` died (and does not leave the group): rounds waiting fail, and inits waiting
  /// for rank 0's value fail. `why` says who and how, for the errors.
  void worker_dead(int rank, const std::string& why) {
    dead_.insert(rank);
    for (auto& [k, s] : slices_) {
      if (!s.round_waiters.empty()) fail_round(s, why);
      if (!s.inited && rank == 0 && !s.init_waiters.empty())
        release_all(s.init_waiters, errc::node_dead,
                    "key " + key_str(k) + " cannot be inited: " + why);
    }
    held_after_death(why);
  }

  /// Worker `rank`'s connection closed: a push it re-sends on its next one starts again from its
  /// first frame.
  void connection_lost(int rank) {
    for (auto& [k, s] : slices_)
      if (auto it = s.parts.find(rank); it != s.parts.end()) it->second.received = 0;
    held_.take_worker(rank);  // their answers cannot reach it; it re-sends them if it comes back
    parked_.drop_worker(rank);
  }

 private:
  using typename shard_pushes<Port>::checks;
  using shard_pushes<Port>::release_all;
  using shard_pushes<Port>::active_workers;
  using shard_pushes<Port>::find;
  using shard_pushes<Port>::cfg_;
  using shard_pushes<Port>::on_change_;
  using shard_pushes<Port>::who_;
  using shard_pushes<Port>::slices_;
  using shard_pushes<Port>::left_;
  using shard_pushes<Port>::dead_;
  using shard_pushes<Port>::held_;
  using shard_pushes<Port>::parked_;
  using shard_pushes<Port>::deferred_;
  using shard_pushes<Port>::release_held;
  using shard_pushes<Port>::release_all_held;
  using shard_pushes<Port>::held_after_death;
  using shard_pushes<Port>::maybe_complete;
  using shard_pushes<Port>::fail_round;

  // Serving a batched frame: changes, answers and held pulls released wait for end_batch()
  // (server/deferred_answers.hpp).
  void begin_batch() { deferred_.begin(); }
  void end_batch() {
    deferred_.end(
        [&](bool important, std::uint64_t changes) {
          if (on_change_) on_change_(important, changes);
        },
        [&](std::uint64_t k) {
          if (slice* s = slices_.find_value(k)) release_held(*s);
        });
  }

  // A sync push from the only worker still in the group, into a part of the round not written
  // yet, is read straight into the round's merge buffer: no staging buffer, no copy (contribute
  // sees the data already in place). With several workers their frames could interleave with a
  // read in progress, so they are staged.
  std::span<std::byte> direct_sink(int rank, const wire::header& h, slice& s) {
    if (!cfg_.sync || !s.inited || h.total != s.total || h.offset < s.lo ||
        h.payload_len % s.elem())
      return {};
    const std::uint64_t rel = h.offset - s.lo, n = h.payload_len / s.elem();
    if (rel > s.size() || n > s.size() - rel || active_workers() != 1 || left_.count(rank) ||
        s.duplicate(rank, h.aux) || s.round_done.count(rank) || parked_.has(s.key, rank) ||
        !s.cov.disjoint(rel, rel + n))
      return {};
    if (s.merge.size() != s.size() * s.elem()) s.merge = slice_value(s.size() * s.elem());
    return {s.merge.data() + rel * s.elem(), static_cast<std::size_t>(h.payload_len)};
  }

  // A compressed push's payload may hold at most the slice's elements in its encoding, in the
  // connection's buffer (push_encoded decodes it; it never goes straight into a round). An
  // encoding this server does not know cannot be sized: its payload is refused unread.
  std::span<std::byte> encoded_sink(const wire::header& h, const slice& s) {
    const wire::encoding e = checks::known_encoding(h, "push", errc::protocol);
    const std::uint64_t limit = wire::encoded_bytes(e, s.size(), s.elem());
    if (h.payload_len > limit)
      throw error(errc::protocol, "a " + std::to_string(h.payload_len) + "-byte " +
                                      wire::encoding_name(e) + " payload for key " +
                                      key_str(h.key) + " that takes at most " +
                                      std::to_string(limit));
    return {};
  }

  // Batched frames (server/batch.hpp): batch_ops and the parts it derives from.
  friend struct batch_ops<Port>;
  friend struct batch_lookup<Port>;
  friend struct batch_init_ops<Port>;
  friend struct batch_push_ops<Port>;
};

}  // namespace kvstore::detail
