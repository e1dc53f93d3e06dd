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
#pragma once

#include <kvstore/detail/key_map.hpp>
#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/server/batch.hpp>
#include <kvstore/server/deferred_answers.hpp>
#include <kvstore/server/frame_plans.hpp>
#include <kvstore/server/held_pulls.hpp>
#include <kvstore/server/parked.hpp>
#include <kvstore/server/pull_gate.hpp>
#include <kvstore/server/request_checks.hpp>
#include <kvstore/server/shard_config.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/server/slice_math.hpp>
#include <kvstore/server/states.hpp>
#include <kvstore/server/value_answers.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>
#include <kvstore/wire/meta.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::detail {

template <class Port>
class shard {
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

  explicit shard(shard_config c, change_hook on_change = {})
      : cfg_(c), on_change_(std::move(on_change)), math_(c.apply_threads) {}

  /// The name that errors use ("server 0").
  void name(std::string who) { who_ = std::move(who); }
  const shard_config& config() const noexcept { return cfg_; }

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

  /// One init frame: meta is the server's slice [lo, hi) of the key, h.aux the row length.
  /// Answered once the key has a value (the frame of rank 0 carries it).
  void init(int rank, const Port& from, const wire::header& h, std::string_view meta,
            std::span<const std::byte> payload) {
    const auto [lo, hi] = wire::decode_init_meta(meta);
    const std::uint64_t rl = h.aux;
    if (h.type != wire::dtype::f32 && h.type != wire::dtype::f64)
      throw error(errc::invalid_argument,
                  "key " + key_str(h.key) + ": init without an element type");
    // (hi - lo) * element size must not wrap: a wrapped size allocates a short value that later
    // writes overrun (found by fuzz/fuzz_server.cpp).
    if (h.total == 0 || lo >= hi || hi > h.total || (rl && (h.total % rl || lo % rl || hi % rl)) ||
        hi - lo > std::numeric_limits<std::size_t>::max() / 8)
      throw error(errc::invalid_argument, "key " + key_str(h.key) + ": bad slice [" +
                                              std::to_string(lo) + ", " + std::to_string(hi) +
                                              ") of " + std::to_string(h.total));
    if ((hi - lo) > cfg_.max_key_bytes / wire::dtype_size(h.type))
      throw error(errc::invalid_argument,
                  "key " + key_str(h.key) + ": a slice of " + std::to_string(hi - lo) +
                      " elements is more than this server's max_key_bytes (" +
                      std::to_string(cfg_.max_key_bytes) + ")");
    auto it = slices_.find(h.key);
    if (it != slices_.end()) {
      const slice& s = it->second;
      if (s.type != h.type || s.total != h.total || s.lo != lo || s.hi != hi || s.row_length != rl)
        throw error(errc::size_mismatch, "key " + key_str(h.key) + ": init with " +
                                             std::to_string(h.total) + " elements (row length " +
                                             std::to_string(rl) + ") but it was inited with " +
                                             std::to_string(s.total) + " (row length " +
                                             std::to_string(s.row_length) + ")");
    } else {
      admit_new_slice(h.key, (hi - lo) * wire::dtype_size(h.type));
      it = slices_.try_emplace(h.key).first;
      slice& s = it->second;
      s.key = h.key;
      s.type = h.type;
      s.total = h.total;
      s.lo = lo;
      s.hi = hi;
      s.row_length = rl;
      s.value = slice_value((hi - lo) * s.elem());
    }
    slice& s = it->second;
    if (s.restored && s.inited) {
      // Restored from a snapshot: an init re-sent after the restart is answered, not refused.
      if (h.flags & wire::flag_last) from.reply(h.req_id, errc::ok, {});
      return;
    }
    if (s.init_done.count(rank) || ((h.flags & wire::flag_has_data) && s.inited))
      throw error(errc::already_inited, "key " + key_str(h.key) + " is already inited");
    if (h.flags & wire::flag_has_data) {
      const std::uint64_t n = checks::check_range(s, h, payload.size());
      if (n)
        std::memcpy(s.value.data() + (h.offset - s.lo) * s.elem(), payload.data(), n * s.elem());
    }
    if (!(h.flags & wire::flag_last)) return;
    s.init_done.insert(rank);
    if (h.flags & wire::flag_has_data) {
      s.inited = true;
      changed(true);
      release_all(s.init_waiters, errc::ok, {});
      from.reply(h.req_id, errc::ok, {});
    } else if (s.inited) {
      from.reply(h.req_id, errc::ok, {});
    } else {
      s.init_waiters.push_back({from, h.req_id});
    }
  }

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
        math_.contribute<T>(s, rel, reinterpret_cast<const T*>(payload.data()), n);
      });
      if (h.flags & wire::flag_last) end_round_push(s, rank, from, h);
      return;
    }
    bool first = true;
    if (s.take_async_frame(rank, h.aux, (h.flags & wire::flag_last) != 0, first))
      with_dtype(s.type, [&]<class T>() {
        math_.apply_range<T>(s, reinterpret_cast<const T*>(payload.data()), rel, n,
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
        math_.apply_range<T>(s, grad, rel, n, /*new_step=*/first);
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
          math_.contribute<T>(s, static_cast<std::uint64_t>(rows[i]) * rl - s.lo, src + i * rl, rl);
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
          math_.apply_range<T>(s, v.data(), static_cast<std::uint64_t>(r) * rl - s.lo, rl, first);
          first = false;
        }
      });
    end_async_frame(s, rank, from, h);
  }

  /// The slice's value, in data frames of at most chunk_bytes (the last flagged); held first
  /// while the slice is below the version in h.aux or the puller is too far ahead (staleness).
  void pull(int rank, const Port& from, const wire::header& h) {
    if (parks(rank, h)) return park(rank, from, h, {}, {});
    slice& s = find(h);
    // A pull in an encoding the server cannot answer is refused now, not once it is released.
    if (wire::encoding_bits(h.flags)) (void)checks::pull_encoding(h);
    if (!may_answer(rank, s, h.aux)) return hold({from, rank, h, {}, {}});
    answers::send_value(from, h, s, cfg_.chunk_bytes);
  }

  /// The rows listed in meta, in data frames (offset: index of the frame's first row in the
  /// list); held as a pull is.
  void pull_rows(int rank, const Port& from, const wire::header& h, std::string_view meta) {
    slice& s = find(h);
    auto rows = checks::check_rows(s, h, meta);
    // Each row at most once (workers ask for distinct rows and copy repeats themselves), so an
    // answer is never bigger than the slice: naming one row 50,000 times would make the server
    // copy it 50,000 times.
    checks::refuse_repeated_rows(h.key, rows);
    if (!may_answer(rank, s, h.aux)) return hold({from, rank, h, std::move(rows), {}});
    answers::send_rows(from, h, s, rows, cfg_.chunk_bytes);
  }

  /// A range pull: the elements its meta names (wire::range_meta, inside the slice), answered
  /// as value_answers::send_range says; held as a pull is.
  void pull_range(int rank, const Port& from, const wire::header& h, std::string_view meta) {
    slice& s = find(h);
    const wire::range_meta r = checks::range_in_slice(s, h, meta, who_);
    if (!may_answer(rank, s, h.aux)) {
      held_pull<Port> p{from, rank, h, {}, {}};
      p.range_offset = r.offset;
      p.range_length = r.length;
      return hold(std::move(p));
    }
    answers::send_range(from, h, s, r, cfg_.chunk_bytes);
  }

  /// The slice's version (rounds completed, or async pushes applied) as the response's aux.
  void version(const Port& from, const wire::header& h) {
    const slice& s = find(h);
    wire::header f;
    f.command = wire::cmd::response;
    f.req_id = h.req_id;
    f.aux = s.round;
    from.send(f, {}, nullptr);
  }

  /// Sets the optimizer by registered name and parameters. The same name again (new parameters:
  /// a learning-rate schedule, or every worker setting it) keeps every key's state; another name
  /// starts them afresh. Any worker may send it, any number of times.
  void set_optimizer(const Port& from, const wire::header& h, std::string_view meta) {
    auto [name, params] = wire::decode_optimizer(meta);
    auto f = optim::create_updater<float>(name, params);  // throws for unknown names, bad params
    auto d = optim::create_updater<double>(name, params);
    math_.use(std::move(f), std::move(d));
    if (name != opt_name_)
      for (auto& [k, s] : slices_) {
        s.st_f = {};
        s.st_d = {};
      }
    if (name != opt_name_ || params != opt_params_) {
      log_info(who_, "optimizer set: " + name);
      opt_name_ = name;
      opt_params_ = params;
      changed(true);
    }
    from.reply(h.req_id, errc::ok, {});
  }

  /// A key's learning-rate and weight-decay multipliers, for its updates from now on.
  void set_key_options(const Port& from, const wire::header& h, std::string_view meta) {
    slice& s = find(h);
    const auto m = wire::decode_key_multipliers(meta);
    s.mult = {m.lr_mult, m.wd_mult};
    changed(true);
    from.reply(h.req_id, errc::ok, {});
  }

  /// The shard's optimizer states (wire::decode_states' format) in one response, aux = entries.
  void save_states(const Port& from, const wire::header& h) {
    auto out = std::make_shared<bytes>();
    const std::uint64_t count = encode_states(slices_, *out);
    wire::header f;
    f.command = wire::cmd::response;
    f.req_id = h.req_id;
    f.aux = count;
    // The answer's text names the optimizer the states belong to: a worker that never set it
    // (rank 0 alone did) still writes the file for the right one.
    from.send(f, {out->data(), out->size()}, out, opt_name_);
  }

  /// Replaces the optimizer states of the keys in `payload` (save_states' format), saved for the
  /// optimizer named in `meta`; everything is checked before anything changes.
  void load_states(const Port& from, const wire::header& h, std::string_view meta,
                   std::span<const std::byte> payload) {
    if (meta.size() > wire::max_optimizer_name_len || meta != opt_name_)
      throw error(errc::invalid_argument, "the optimizer states were saved for optimizer \"" +
                                              std::string(meta.substr(0, 64)) + "\", " + who_ +
                                              " runs \"" + opt_name_ + "\"");
    replace_states(slices_, payload, who_);
    from.reply(h.req_id, errc::ok, {});
  }

  // ---- membership -----------------------------------------------------------------------------

  bool has_left(int rank) const { return left_.count(rank) != 0; }
  bool is_dead(int rank) const { return dead_.count(rank) != 0; }

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

  /// Whether requests of worker `rank` on `key` are kept back behind an open sync round.
  bool parked(std::uint64_t key, int rank) const { return parked_.has(key, rank); }

  // ---- held pulls (versions and bounded staleness) --------------------------------------------

  /// Answers the held pulls whose deadline passed at `now` with a timeout naming the key and what
  /// it waited for. Returns the next deadline, if pulls are still held.
  std::optional<std::chrono::steady_clock::time_point> expire_held(
      std::chrono::steady_clock::time_point now) {
    for (auto& p : held_.take_expired(now))
      p.port.reply(p.h.req_id, errc::timeout,
                   why_held(p) + " for " + std::to_string(cfg_.hold_timeout.count()) +
                       " ms, this server's limit");
    return held_.next_deadline();
  }
  std::optional<std::chrono::steady_clock::time_point> next_held_deadline() const {
    return held_.next_deadline();
  }
  /// How many slices' open sync rounds hold a push of worker `rank`. While none does, no push of
  /// it can be its second in a round, so a planned batched push needs no slice read before it
  /// changes anything (batch_ops::push).
  std::int64_t open_pushes(int rank) const noexcept {
    const auto r = static_cast<std::size_t>(rank);
    return r < open_pushes_.size() ? open_pushes_[r] : 0;
  }
  /// How many pulls are held (of worker `rank`, or of all).
  std::size_t held(int rank) const { return held_.count(rank); }
  std::size_t held() const { return held_.size(); }

  // ---- whole state, for snapshots (server/snapshots.hpp) --------------------------------------

  const slice_map& slices() const noexcept { return slices_; }
  const std::string& optimizer_name() const noexcept { return opt_name_; }
  const std::string& optimizer_params() const noexcept { return opt_params_; }

  /// Replaces every slice and the optimizer (a restore). Throws, changing nothing, when the
  /// optimizer is unknown or its parameters are bad.
  void adopt(slice_map slices, const std::string& opt_name, const std::string& opt_params) {
    optim::updater<float> f;
    optim::updater<double> d;
    if (!opt_name.empty()) {
      f = optim::create_updater<float>(opt_name, opt_params);
      d = optim::create_updater<double>(opt_name, opt_params);
    }
    slices_ = std::move(slices);
    open_pushes_.clear();
    for (const auto& entry : slices_)
      entry.second.round_done.for_each([&](int r) { add_at(open_pushes_, r, 1); });
    held_.take_all();
    parked_.clear();
    waits_.clear();
    held_bytes_ = 0;
    for (const auto& entry : slices_)
      held_bytes_ += entry.second.size() * entry.second.elem() + key_overhead_bytes;
    math_.use(std::move(f), std::move(d));
    opt_name_ = opt_name;
    opt_params_ = opt_params;
  }

  static std::string key_str(std::uint64_t k) { return detail::key_str(k); }

 private:
  using checks = slice_checks<slice>;   // a request against a slice (server/request_checks.hpp)
  using answers = value_answers<Port>;  // a pull's data frames (server/value_answers.hpp)

  // A new slice of `bytes` must fit the key count and byte bounds, so a peer's inits cannot grow
  // the server without bound; refused before anything is allocated.
  void admit_new_slice(std::uint64_t key, std::uint64_t bytes) {
    if (slices_.size() >= cfg_.max_keys)
      throw error(errc::invalid_argument, "key " + key_str(key) + ": this server already holds " +
                                              std::to_string(slices_.size()) +
                                              " keys, its max_keys (KVSTORE_MAX_KEYS)");
    const std::uint64_t cost = bytes + key_overhead_bytes;
    if (cfg_.max_total_bytes &&
        (cost > cfg_.max_total_bytes || held_bytes_ > cfg_.max_total_bytes - cost))
      throw error(errc::invalid_argument,
                  "key " + key_str(key) + ": " + std::to_string(bytes) +
                      " more bytes would take this server past its max_total_bytes (" +
                      std::to_string(cfg_.max_total_bytes) + ", KVSTORE_MAX_TOTAL_BYTES; " +
                      std::to_string(held_bytes_) + " held)");
    held_bytes_ += cost;
  }

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

  int active_workers() const {
    int n = 0;
    for (int r = 0; r < cfg_.num_workers; ++r) n += !left_.count(r);
    return n;
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
  // The round of `s` is over (applied or failed): its workers' pushes are no longer open.
  void close_round(slice& s, pass_effects<Port>* fx = nullptr) {
    s.round_done.for_each([&](int r) { count_open_pushes(r, -1, fx); });
    s.round_done.clear();
  }

  // Applies the round of `s` if every worker's push is in. On a pool thread (`fx`), the change
  // and the answers are left to the io thread (batch_ops::push_in_runs).
  void maybe_complete(slice& s, pass_effects<Port>* fx = nullptr) {
    if (!round_complete(s)) return;
    with_dtype(s.type, [&]<class T>() { math_.apply_round<T>(s, /*may_cut=*/!fx); });
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

  // ---- held pulls ----------------------------------------------------------------------------

  // The rules of versions and bounded staleness (server/pull_gate.hpp).
  pull_gate gate() const noexcept { return {cfg_, left_, dead_}; }
  bool may_answer(int rank, const slice& s, std::uint64_t min_version) const {
    return gate().may_answer(rank, s, min_version);
  }

  void hold(held_pull<Port> p) {
    p.deadline = std::chrono::steady_clock::now() + cfg_.hold_timeout;
    const std::string what = "a pull of key " + key_str(p.h.key);
    held_.hold(std::move(p), {cfg_.max_held_pulls, cfg_.max_held_bytes}, who_, what);
  }

  void answer_held(const held_pull<Port>& p, const slice& s) {
    if (p.h.command == wire::cmd::pull_rows)
      answers::send_rows(p.port, p.h, s, p.rows, cfg_.chunk_bytes);
    else if (p.h.flags & wire::flag_range)
      answers::send_range(p.port, p.h, s, {p.range_offset, p.range_length}, cfg_.chunk_bytes);
    else
      answers::send_value(p.port, p.h, s, cfg_.chunk_bytes);
  }

  // Answers the held pulls of `s` that may be answered now.
  void release_held(const slice& s) {
    if (held_.empty()) return;
    if (deferred_.active()) return deferred_.held(s.key);
    for (auto& p : held_.take_ready(
             s.key, [&](const held_pull<Port>& q) { return may_answer(q.rank, s, q.h.aux); }))
      answer_held(p, s);
  }

  void release_all_held() {
    for (auto k : held_.keys())
      if (slice* s = slices_.find_value(k)) release_held(*s);
  }

  // A worker died without leaving the group: in dist_sync no round completes any more, so a
  // pull waiting for a version fails now; in dist_async the dead worker holds no one back.
  void held_after_death(const std::string& why) {
    if (!cfg_.sync) return release_all_held();
    for (auto& p : held_.take_all())
      p.port.reply(p.h.req_id, errc::node_dead, why_held(p) + ", which cannot come: " + why);
  }

  // What a held pull waits for, for its error.
  std::string why_held(const held_pull<Port>& p) const {
    return gate().why_waits(p.rank, p.h.key, p.h.aux, slices_.find_value(p.h.key), who_);
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
  friend struct batch_ops<Port>;
  batch_waits<Port> waits_;           // batched requests waiting for their keys
  std::uint64_t batch_stamp_ = 0;     // numbers batched frames (key_slice::batch_stamp)
  std::vector<slice*> batch_slices_;  // a frame's slices, found before anything changes
  frame_plans<slice> plans_;          // recent frames' slices (server/frame_plans.hpp)
  deferred_answers<Port> deferred_;   // while a batched frame is served: see begin_batch()
};

}  // namespace kvstore::detail
