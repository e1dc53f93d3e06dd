// One key's slice on a server: the elements [lo, hi) of the key this server owns, its value, its
// optimizer state, the sync round being gathered, and the bookkeeping that makes a push re-sent
// after a server restart count exactly once. Plain data and the small rules about it; the shard
// (server/shard.hpp) decides what happens to it.
#pragma once

#include <kvstore/optim/all.hpp>
#include <kvstore/server/coverage.hpp>
#include <kvstore/server/ranks.hpp>
#include <kvstore/server/slice_value.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/snapshot.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace kvstore::detail {

/// Calls f.template operator()<T>() with T the element type of `t`.
template <class F>
decltype(auto) with_dtype(wire::dtype t, F&& f) {
  if (t == wire::dtype::f64) return f.template operator()<double>();
  return f.template operator()<float>();
}

/// A key as a server's errors name it: its id, or for a named key (top bit set) what it is.
inline std::string key_str(std::uint64_t k) {
  return (k >> 63) ? "(named key id " + std::to_string(k) + ")"
                   : std::to_string(static_cast<std::int64_t>(k));
}

/// No batched request (server/batch.hpp).
inline constexpr std::uint32_t no_batch = ~std::uint32_t{0};

/// Where an answer goes: the asker (`Port`, see server/shard.hpp; it may be gone) and its
/// request id; or, for a key of a batched request, that request's countdown (`batch`), which
/// answers once all its keys are done.
template <class Port>
struct reply_to {
  Port port;
  std::uint64_t req_id = 0;
  std::uint32_t batch = no_batch;
  /// A key of a batch_push flagged flag_each: consecutive ok answers of such keys to one peer
  /// go out as one response (flag_each, aux = how many; server/deferred_answers.hpp).
  bool each = false;
};

/// An ok answer to pushes first .. first + n - 1 (wire::acks_header) to `to`: through the port's
/// own ack when it has one (a connection extends the acks it has queued, building no frame),
/// else as a frame of its own.
template <class Port>
void send_acks(const Port& to, std::uint64_t first, std::uint64_t n) {
  if constexpr (requires { to.ack(first, n); })
    to.ack(first, n);
  else
    to.send(wire::acks_header(first, n), {}, {});
}

/// The first bytes of a slice, up to batch_stamp: what a batched push of several workers reads
/// of every key (its round: who pushed, the sum, the waiters, the push numbers), prefetched
/// some keys ahead (server/batch.hpp). A slice starts 8 bytes into its node, which
/// detail/key_map.hpp starts on a cache line, so these bytes are its first four lines.
inline constexpr std::size_t slice_hot_bytes = 232;
/// The first bytes of a slice, up to applied's first number: all a push of the only worker in
/// its round reads of the slice (with rank 0 and no optimizer: its sizes, round, value, coverage
/// and last push applied). With the node's 8 they are exactly its first two lines: over a
/// million keys a push's pass is bound by the lines in flight.
inline constexpr std::size_t slice_lone_push_bytes = 120;
/// The first bytes of a slice, up to its value: what a batched pull reads of every key (a pull
/// that might wait for slower workers, which reads more, is not batched).
inline constexpr std::size_t slice_pull_bytes = 80;

/// One key's slice on this server.
template <class Port>
struct key_slice : wire::slice_header {
  // What a push or pull of the key reads, in the slice's first slice_hot_bytes with the header
  // (a batched frame prefetches them some keys ahead; server/batch.hpp), and in this order: a
  // push of the only worker reads no further than applied's first number (slice_lone_push_bytes;
  // test_shard_batch checks the offsets), a pull no further than the value.
  slice_value value;  // inside the slice when small, else shared with pull answers in flight
  coverage cov;       // elements of the round being gathered that some push covered
  // Exactly-once pushes across a server restart: per worker, the sequence number of its last
  // push applied (kept in snapshots).
  rank_values applied;
  // The rest of the sync round being gathered, and each worker's push number in it.
  rank_set round_done;  // workers whose push is in the round
  slice_value merge;    // sized on the round's first push
  std::vector<reply_to<Port>> round_waiters;
  rank_values round_seq;
  // The batched frame that named this slice last (server/batch.hpp: a key named twice in one
  // frame is refused before anything changes).
  std::uint64_t batch_stamp = 0;
  bool inited = false;
  bool restored = false;        // loaded from a snapshot: re-sent inits are acknowledged
  bool serving_parked = false;  // the shard serves requests kept back behind its round

  // The last pull answer in 16 bits (half the value's bytes), reused when no frame holds it: a
  // cache, so answering (which reads the slice) may set it.
  mutable std::shared_ptr<bytes> encoded;
  rank_set init_done;  // workers whose init arrived
  std::vector<reply_to<Port>> init_waiters;

  // dist_async applies a push sent in several frames frame by frame. Per worker, the push in
  // progress: its sequence number, how many of its frames were applied (kept in snapshots) and
  // how many arrived on the worker's current connection. After a restart from a snapshot taken
  // mid-push, the re-sent push's first `applied` frames are skipped: exactly once, frame by frame.
  struct part {
    std::uint64_t seq = 0, applied = 0, received = 0;
  };
  std::map<int, part> parts;

  /// Whether to apply this frame (`last`: flagged last) of worker `rank`'s async push `seq` (0:
  /// not numbered, always applied), and whether it is the push's first frame applied (one
  /// optimizer step per push). A push of one frame is applied at once, nothing tracked.
  bool take_async_frame(int rank, std::uint64_t seq, bool last, bool& first) {
    first = true;
    if (seq == 0) return true;
    auto it = parts.find(rank);
    if (it == parts.end()) {
      if (last) return true;
      it = parts.emplace(rank, part{}).first;
    }
    auto& p = it->second;
    if (p.seq != seq) p = part{seq, 0, 0};
    if (++p.received <= p.applied) return false;  // re-sent: applied before the restart
    first = p.applied++ == 0;
    return true;
  }

  /// A re-sent push this slice already applied (sequence 0: not numbered, never a duplicate).
  bool duplicate(int rank, std::uint64_t seq) const { return seq != 0 && applied.get(rank) >= seq; }

  optim::state<float> st_f;
  optim::state<double> st_d;
  /// The key's learning-rate and weight-decay multipliers (set_key_options).
  optim::multipliers mult;
  /// The optimizer state of element type T.
  template <class T>
  optim::state<T>& state() {
    if constexpr (std::is_same_v<T, float>)
      return st_f;
    else
      return st_d;
  }
  template <class T>
  const optim::state<T>& state() const {
    if constexpr (std::is_same_v<T, float>)
      return st_f;
    else
      return st_d;
  }

  std::size_t elem() const { return wire::dtype_size(type); }
  std::uint64_t size() const { return hi - lo; }
};

}  // namespace kvstore::detail
