// What every part of a shard (server/shard.hpp) stands on: its state (slices, optimizer, who
// left or died, held and kept-back requests, batched frames' bookkeeping) and the steps all its
// requests share: a request's slice found, a worker that left refused, a change reported, an
// answer sent now or at a batched frame's end. The shard's other jobs are layers over it.
#pragma once

#include <kvstore/detail/key_map.hpp>
#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/server/batch_waits.hpp>
#include <kvstore/server/deferred_answers.hpp>
#include <kvstore/server/frame_plans.hpp>
#include <kvstore/server/held_pulls.hpp>
#include <kvstore/server/parked.hpp>
#include <kvstore/server/ranks.hpp>
#include <kvstore/server/request_checks.hpp>
#include <kvstore/server/shard_config.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/server/slice_math.hpp>
#include <kvstore/server/slice_value.hpp>
#include <kvstore/server/value_answers.hpp>
#include <kvstore/wire/frame.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::detail {

/// The base of shard<Port> (server/shard.hpp): its state and shared steps, nothing it serves.
template <class Port>
class shard_core {
 public:
  using slice = key_slice<Port>;
  using slice_map = key_map<slice>;  // flat: a batched frame looks up every key
  /// What one key costs this server beyond its value's bytes, as max_total_bytes counts it: its
  /// slice and its place in the key map, and a value's buffer of its own. (A sync round's sum and
  /// the optimizer's state come on top, each at most a few times the value's bytes.)
  static constexpr std::uint64_t key_overhead_bytes =
      slice_map::bytes_per_value + slice_value::own_buffer_bytes;
  /// Called when the shard changed (`important`: an init or optimizer change; `changes`: how
  /// many keys' rounds or pushes, one call for a batched frame's) before the change is
  /// answered, so a snapshot taken then holds everything that was answered.
  using change_hook = std::function<void(bool important, std::uint64_t changes)>;

  explicit shard_core(shard_config c, change_hook on_change = {})
      : cfg_(c), on_change_(std::move(on_change)), math_(c.apply_threads) {}

  /// The name that errors use ("server 0").
  void name(std::string who) { who_ = std::move(who); }
  const shard_config& config() const noexcept { return cfg_; }

  // ---- membership, as the requests see it -------------------------------------------------------

  bool has_left(int rank) const { return left_.count(rank) != 0; }
  bool is_dead(int rank) const { return dead_.count(rank) != 0; }

  /// Whether requests of worker `rank` on `key` are kept back behind an open sync round.
  bool parked(std::uint64_t key, int rank) const { return parked_.has(key, rank); }
  /// How many slices' open sync rounds hold a push of worker `rank`. While none does, no push of
  /// it can be its second in a round, so a planned batched push needs no slice read before it
  /// changes anything (batch_ops::push).
  std::int64_t open_pushes(int rank) const noexcept {
    const auto r = static_cast<std::size_t>(rank);
    return r < open_pushes_.size() ? open_pushes_[r] : 0;
  }

  // ---- whole state, for snapshots (server/snapshots.hpp) --------------------------------------

  const slice_map& slices() const noexcept { return slices_; }
  const std::string& optimizer_name() const noexcept { return opt_name_; }
  const std::string& optimizer_params() const noexcept { return opt_params_; }

  static std::string key_str(std::uint64_t k) { return detail::key_str(k); }

 protected:
  using checks = slice_checks<slice>;   // a request against a slice (server/request_checks.hpp)
  using answers = value_answers<Port>;  // a pull's data frames (server/value_answers.hpp)

  void changed(bool important = false) {
    if (deferred_.active()) return deferred_.change(important);
    if (on_change_) on_change_(important, 1);
  }
  // `n` plain changes at once (the keys of a batched frame served on the pool threads).
  void changed_by(std::uint64_t n) {
    if (!n) return;
    if (deferred_.active()) return deferred_.change(false, n);
    if (on_change_) on_change_(false, n);
  }

  // ---- answers -------------------------------------------------------------------------------

  // A response to `to` (a request, or a key of a batched one, which answers once all its keys
  // are done). While a batched frame is served, responses wait until its changes are reported
  // (one snapshot for the frame, taken before anything it did is answered).
  void release(const reply_to<Port>& to, errc status, const std::string& msg) {
    if (to.batch != no_batch) return waits_.done(to.batch, status, msg, *this);
    answer(to.port, to.req_id, status, msg, to.each);
  }
  void release_all(std::vector<reply_to<Port>>& waiters, errc status, const std::string& msg) {
    for (auto& w : waiters) release(w, status, msg);
    waiters.clear();
  }
  // `each`: an answer to a push (or a fused push's key), which says nothing but "done" when ok.
  void answer(const Port& to, std::uint64_t req_id, errc status, std::string msg,
              bool each = false) {
    if (deferred_.active())
      return deferred_.answer({to, req_id, no_batch, each}, status, std::move(msg));
    if (each && status == errc::ok) return ack(to, req_id);
    to.reply(req_id, status, std::move(msg));
  }
  // An ok answer to push `req_id`, as wire::acks_header: the connection merges it with the acks
  // queued right before it, so many pushes in flight are answered by few frames.
  static void ack(const Port& to, std::uint64_t req_id) { send_acks(to, req_id, 1); }
  friend class batch_waits<Port>;  // answers through answer()

  int active_workers() const {
    int n = 0;
    for (int r = 0; r < cfg_.num_workers; ++r) n += !left_.count(r);
    return n;
  }

  slice& find(const wire::header& h) { return find(h.key, h.type, h.total); }
  // The slice of `key`, inited, of element type `type`, of a key of `total` elements.
  slice& find(std::uint64_t key, wire::dtype type, std::uint64_t total) {
    slice* found = slices_.find_value(key);
    if (!found || !found->inited)
      throw error(errc::unknown_key, "key " + key_str(key) + " was never inited on " + who_);
    slice& s = *found;
    if (type != s.type)
      throw error(errc::invalid_argument,
                  "key " + key_str(key) + ": element type differs from its init");
    if (total != s.total)
      throw error(errc::size_mismatch, "key " + key_str(key) + " has " + std::to_string(s.total) +
                                           " elements, the request says " + std::to_string(total));
    return s;
  }

  // A worker that left the group (leave, bye) pushes no more: its push is refused, not summed.
  // (The checks run on every push of every key: the throwing halves are out of line, so that
  // the checks themselves inline.)
  void refuse_if_left(int rank, std::uint64_t key) const {
    if (left_.count(rank)) refuse_left(rank, key);
  }
  [[noreturn]] void refuse_left(int rank, std::uint64_t key) const {
    const std::string msg = who_ + " refused a push of key " + key_str(key) + " from worker " +
                            std::to_string(rank) + ": it left the sync group";
    log_warn(who_, msg);
    throw error(errc::invalid_argument, msg);
  }

  // `d` more of worker `rank`'s pushes are in open rounds: on a pool thread (`fx`) counted in fx,
  // added on the io thread when its run is done (batch_ops::push_in_runs).
  void count_open_pushes(int rank, std::int64_t d, pass_effects<Port>* fx = nullptr) {
    add_at(fx ? fx->open_pushes : open_pushes_, rank, d);
  }
  static void add_at(std::vector<std::int64_t>& counts, int rank, std::int64_t d) {
    const auto r = static_cast<std::size_t>(rank);
    if (counts.size() <= r) counts.resize(r + 1, 0);
    counts[r] += d;
  }

  // ---- requests kept back behind an open sync round (server/parked.hpp) -----------------------

  // In dist_sync, a push or pull of worker `rank` waits while its push of the key's open round
  // is in, or while earlier requests of it on the key wait: a worker that pipelines its ops
  // (dist_options::pipeline_depth) sends them before that push is answered, and they take effect
  // after the round, in the order they came.
  bool parks(int rank, const wire::header& h) const {
    if (!cfg_.sync || serving_parked_) return false;
    const slice* s = slices_.find_value(h.key);
    if (!s) return false;  // unknown here: refused as usual
    return s->round_done.count(rank) || parked_.has(h.key, rank);
  }

  void park(int rank, const Port& from, const wire::header& h, std::string_view meta,
            std::span<const std::byte> payload) {
    // Bounded by bytes alone (each request counts its copy and its bookkeeping): a worker that
    // pulls every key after pushing it parks a pull per key, more than max_held_pulls allows.
    parked_.park(rank, from, h, meta, payload,
                 {std::numeric_limits<std::size_t>::max(), cfg_.max_held_bytes}, who_);
  }

  shard_config cfg_;
  std::uint64_t held_bytes_ = 0;  // slices' bytes plus key_overhead_bytes each (max_total_bytes)
  change_hook on_change_;
  std::string who_ = "server";
  slice_map slices_;
  slice_math math_;  // sums rounds, applies updates (server/slice_math.hpp)
  std::string opt_name_, opt_params_;
  rank_set left_, dead_;
  std::vector<std::int64_t> open_pushes_;  // per worker: see open_pushes()
  bytes scratch_;          // a compressed async push's frame, decoded (at most a slice's bytes)
  held_pulls<Port> held_;  // pulls waiting for a version or slower workers
  parked_requests<Port> parked_;  // pipelined requests behind an open sync round
  bool serving_parked_ = false;   // serve_one at work: its request is not kept back again

  // Batched frames (server/batch.hpp).
  batch_waits<Port> waits_;           // batched requests waiting for their keys
  std::uint64_t batch_stamp_ = 0;     // numbers batched frames (key_slice::batch_stamp)
  std::vector<slice*> batch_slices_;  // a frame's slices, found before anything changes
  frame_plans<slice> plans_;          // recent frames' slices (server/frame_plans.hpp)
  deferred_answers<Port> deferred_;   // while a batched frame is served: see begin_batch()
};

}  // namespace kvstore::detail
