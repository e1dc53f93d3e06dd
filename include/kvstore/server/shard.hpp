// One server's shard of the model, without a network: for each key the slice this server owns
// (server/slice.hpp). It takes decoded requests (header, metadata, payload, and a `Port` to
// answer), sums a sync round's pushes of all workers and applies the optimizer once, applies
// async pushes as they come, answers pulls (queued until their round completes), and moves
// optimizer states in and out. The node loop (server/server.hpp) feeds it frames and membership;
// the unit tests (tests/unit/test_shard.cpp) feed it by hand.
//
// A Port is a copyable handle to the peer that asked; it may be gone by the time a queued answer
// is sent, and then drops it:
//   void reply(std::uint64_t req_id, errc status, std::string message) const;  // a response
//   void send(wire::header h, std::span<const std::byte> payload,              // any other
//             std::shared_ptr<const void> keep) const;  // frame; `keep` owns the payload bytes
// Everything runs on one thread (the server's io thread): no locks.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>
#include <kvstore/wire/meta.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvstore::detail {

/// What a shard needs to know of the job (the server fills it from dist_options).
struct shard_config {
  bool sync = true;  ///< dist_sync rounds, or dist_async
  int num_workers = 1;
  std::size_t chunk_bytes = std::size_t{1} << 20;        ///< a pull is answered in frames of this
  std::size_t max_frame_bytes = std::size_t{1} << 30;    ///< an init frame carries at most this
  std::uint64_t max_key_bytes = std::uint64_t{8} << 30;  ///< bytes of one key slice at most
  /// Bytes of all slices together (each also counts key_overhead_bytes); 0: no bound.
  std::uint64_t max_total_bytes = 0;
  std::uint64_t max_keys = std::uint64_t{1} << 24;  ///< slices this shard holds at most
};

/// What one key costs a server beyond its value (its slice record, map node, round state), as
/// max_total_bytes counts it.
inline constexpr std::uint64_t key_overhead_bytes = 256;

template <class Port>
class shard {
 public:
  using slice = key_slice<Port>;
  using slice_map = std::unordered_map<std::uint64_t, slice>;
  /// Called when the shard changed (`important`: an init or optimizer change) before the change
  /// is answered, so a snapshot taken then holds everything that was answered.
  using change_hook = std::function<void(bool important)>;

  explicit shard(shard_config c, change_hook on_change = {})
      : cfg_(c), on_change_(std::move(on_change)) {}

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
        auto it = slices_.find(h.key);
        if (it == slices_.end() || it->second.type != h.type) {
          too_big(0);  // never inited here: no payload is acceptable
          return {};
        }
        if (h.command == wire::cmd::push && wire::encoding_bits(h.flags))
          return encoded_sink(h, it->second);
        too_big(it->second.size() * it->second.elem());
        if (h.command == wire::cmd::push) return direct_sink(rank, h, it->second);
        return {};
      }
      case wire::cmd::load_states:
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
        return push(rank, from, h, payload);
      case wire::cmd::push_rows:
        return push_rows(rank, from, h, meta, payload);
      case wire::cmd::pull:
        return pull(from, h);
      case wire::cmd::pull_rows:
        return pull_rows(from, h, meta);
      case wire::cmd::set_optimizer:
        return set_optimizer(from, h, meta);
      case wire::cmd::save_states:
        return save_states(from, h);
      case wire::cmd::load_states:
        return load_states(from, h, payload);
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
      s.value = std::make_shared<bytes>((hi - lo) * s.elem());
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
      const std::uint64_t n = check_range(s, h, payload.size());
      if (n)
        std::memcpy(s.value->data() + (h.offset - s.lo) * s.elem(), payload.data(), n * s.elem());
    }
    if (!(h.flags & wire::flag_last)) return;
    s.init_done.insert(rank);
    if (h.flags & wire::flag_has_data) {
      s.inited = true;
      changed(true);
      for (auto& w : s.init_waiters) w.port.reply(w.req_id, errc::ok, {});
      s.init_waiters.clear();
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
    if (wire::encoding_bits(h.flags)) return push_encoded(rank, from, h, payload);
    refuse_if_left(rank, h.key);
    slice& s = find(h);
    const std::uint64_t n = check_range(s, h, payload.size());
    if (s.duplicate(rank, h.aux)) return ack_duplicate(from, h);
    const std::uint64_t rel = h.offset - s.lo;
    if (cfg_.sync) {
      begin_round_push(s, rank);
      with_dtype(s.type, [&]<class T>() {
        contribute<T>(s, rel, reinterpret_cast<const T*>(payload.data()), n);
      });
      if (h.flags & wire::flag_last) end_round_push(s, rank, from, h);
      return;
    }
    bool first = true;
    if (s.take_async_frame(rank, h.aux, (h.flags & wire::flag_last) != 0, first))
      with_dtype(s.type, [&]<class T>() {
        apply_range<T>(s, reinterpret_cast<const T*>(payload.data()), rel, n, /*new_step=*/first);
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
    const wire::encoding e = known_encoding(h, "push");
    with_dtype(s.type, [&]<class T>() {
      wire::payload_view<T> v;
      try {
        v = wire::view_payload<T>(e, payload);
      } catch (const error& bad) {
        throw error(errc::protocol, "key " + key_str(h.key) + ": " + bad.what());
      }
      const std::uint64_t n = check_elements(s, h, v.count);
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
        apply_range<T>(s, grad, rel, n, /*new_step=*/first);
      }
      end_async_frame(s, rank, from, h);
    });
  }

  /// A push of rows: meta lists the row ids, the payload holds one row per id.
  void push_rows(int rank, const Port& from, const wire::header& h, std::string_view meta,
                 std::span<const std::byte> payload) {
    refuse_if_left(rank, h.key);
    slice& s = find(h);
    auto rows = check_rows(s, h, meta);
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
          contribute<T>(s, static_cast<std::uint64_t>(rows[i]) * rl - s.lo, src + i * rl, rl);
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
          apply_range<T>(s, v.data(), static_cast<std::uint64_t>(r) * rl - s.lo, rl, first);
          first = false;
        }
      });
    end_async_frame(s, rank, from, h);
  }

  /// The slice's value, in data frames of at most chunk_bytes (the last flagged).
  void pull(const Port& from, const wire::header& h) {
    slice& s = find(h);
    if (wire::encoding_bits(h.flags)) return pull_encoded(from, h, s);
    const std::size_t chunk = std::max<std::size_t>(1, cfg_.chunk_bytes / s.elem());
    std::shared_ptr<const void> keep = s.value;
    const std::byte* base = s.value->data();
    for (std::uint64_t off = 0; off < s.size(); off += chunk) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk, s.size() - off);
      wire::header f = data_header(s, h);
      f.offset = s.lo + off;
      if (off + n == s.size()) f.flags = wire::flag_last;
      from.send(f, {base + off * s.elem(), static_cast<std::size_t>(n * s.elem())}, keep);
    }
  }

  /// The slice's value in the 16-bit encoding the pull asks for (its flags), encoded once and
  /// sent in data frames of at most chunk_bytes, each flagged with the encoding.
  void pull_encoded(const Port& from, const wire::header& h, slice& s) {
    const wire::encoding e = known_encoding(h, "pull");
    if (!wire::is_16bit(e))
      throw error(errc::invalid_argument, "key " + key_str(h.key) + ": a pull in " +
                                              wire::encoding_name(e) +
                                              ": 2-bit compression applies to pushes only");
    // The slice's last answer when no frame still holds it: a new buffer per pull costs page
    // faults and zeroing (32 MiB of them for a 64 MiB slice).
    if (!s.encoded || s.encoded.use_count() > 1) s.encoded = std::make_shared<bytes>();
    auto buf = s.encoded;
    buf->resize(wire::encoded_bytes(e, s.size(), s.elem()));
    with_dtype(s.type, [&]<class T>() {
      wire::encode_16bit(e, reinterpret_cast<const T*>(s.value->data()), s.size(), buf->data());
    });
    const std::size_t chunk = std::max<std::size_t>(1, cfg_.chunk_bytes / 2);
    for (std::uint64_t off = 0; off < s.size(); off += chunk) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk, s.size() - off);
      wire::header f = data_header(s, h);
      f.offset = s.lo + off;
      f.flags = wire::encoding_flags(e) | (off + n == s.size() ? wire::flag_last : 0u);
      from.send(f, {buf->data() + 2 * off, static_cast<std::size_t>(2 * n)}, buf);
    }
  }

  /// The rows listed in meta, in data frames (offset: index of the frame's first row in the list).
  void pull_rows(const Port& from, const wire::header& h, std::string_view meta) {
    slice& s = find(h);
    auto rows = check_rows(s, h, meta);
    // Each row at most once (workers ask for distinct rows and copy repeats themselves), so an
    // answer is never bigger than the slice: naming one row 50,000 times would make the server
    // copy it 50,000 times.
    refuse_repeated_rows(h.key, rows);
    const std::uint64_t rl = s.row_length, row_bytes = rl * s.elem();
    const std::size_t per =
        std::max<std::size_t>(1, cfg_.chunk_bytes / std::max<std::uint64_t>(row_bytes, 1));
    std::size_t i = 0;
    do {
      const std::size_t n = std::min(per, rows.size() - i);
      auto buf = std::make_shared<bytes>(n * row_bytes);
      for (std::size_t j = 0; j < n; ++j)
        std::memcpy(
            buf->data() + j * row_bytes,
            s.value->data() + (static_cast<std::uint64_t>(rows[i + j]) * rl - s.lo) * s.elem(),
            row_bytes);
      wire::header f = data_header(s, h);
      f.offset = i;
      f.flags = wire::flag_rows | (i + n == rows.size() ? wire::flag_last : 0u);
      from.send(f, {buf->data(), buf->size()}, buf);
      i += n;
    } while (i < rows.size());
  }

  /// Sets the optimizer by registered name and parameters; every key's state starts afresh.
  void set_optimizer(const Port& from, const wire::header& h, std::string_view meta) {
    auto [name, params] = wire::decode_optimizer(meta);
    auto f = optim::create_updater<float>(name, params);  // throws for unknown names, bad params
    auto d = optim::create_updater<double>(name, params);
    upd_f_ = std::move(f);
    upd_d_ = std::move(d);
    for (auto& [k, s] : slices_) {
      s.st_f = {};
      s.st_d = {};
    }
    opt_name_ = name;
    opt_params_ = params;
    changed(true);
    log_info(who_, "optimizer set: " + name);
    from.reply(h.req_id, errc::ok, {});
  }

  /// The shard's optimizer states (wire::decode_states' format) in one response, aux = entries.
  void save_states(const Port& from, const wire::header& h) {
    auto out = std::make_shared<bytes>();
    std::uint64_t count = 0;
    for (auto& entry : slices_) {
      // Named, not structured bindings: clang 14 cannot capture those in the lambda below.
      const std::uint64_t k = entry.first;
      auto& s = entry.second;
      if (!s.inited) continue;
      with_dtype(s.type, [&]<class T>() {
        auto& st = s.template state<T>();
        if (st.slots.empty() && st.step == 0) return;
        const auto head = wire::encode_state_head(k, s.type, s.lo, s.hi, s.total, st.step,
                                                  static_cast<std::uint32_t>(st.slots.size()));
        auto* p = reinterpret_cast<const std::byte*>(head.data());
        out->insert(out->end(), p, p + head.size());
        for (auto& sl : st.slots) {
          auto* q = reinterpret_cast<const std::byte*>(sl.data());
          out->insert(out->end(), q, q + sl.size() * sizeof(T));
        }
        ++count;
      });
    }
    wire::header f;
    f.command = wire::cmd::response;
    f.req_id = h.req_id;
    f.aux = count;
    from.send(f, {out->data(), out->size()}, out);
  }

  /// Replaces the optimizer states of the keys in `payload` (save_states' format); everything
  /// is checked before anything changes.
  void load_states(const Port& from, const wire::header& h, std::span<const std::byte> payload) {
    struct staged {
      slice* s;
      optim::state<float> f;
      optim::state<double> d;
    };
    std::vector<staged> all;
    for (const auto& e :
         wire::decode_states({reinterpret_cast<const char*>(payload.data()), payload.size()})) {
      auto it = slices_.find(e.key);
      if (it == slices_.end() || !it->second.inited)
        throw error(errc::unknown_key,
                    "optimizer states name key " + key_str(e.key) + ", unknown on " + who_);
      slice& s = it->second;
      if (s.type != e.type || s.lo != e.lo || s.hi != e.hi || s.total != e.total ||
          e.nslots > optim::max_slots)
        throw error(errc::size_mismatch, "optimizer states of key " + key_str(e.key) +
                                             " do not match its slice on " + who_);
      staged st{&s, {}, {}};
      with_dtype(e.type, [&]<class T>() {
        optim::state<T>& dst = [&]() -> optim::state<T>& {
          if constexpr (std::is_same_v<T, float>)
            return st.f;
          else
            return st.d;
        }();
        dst.step = e.step;
        dst.slots.resize(e.nslots);
        for (std::uint32_t i = 0; i < e.nslots; ++i) {
          auto raw = e.slot(i);
          dst.slots[i].resize(e.hi - e.lo);
          std::memcpy(dst.slots[i].data(), raw.data(), raw.size());
        }
      });
      all.push_back(std::move(st));
    }
    for (auto& st : all) {
      st.s->st_f = std::move(st.f);
      st.s->st_d = std::move(st.d);
    }
    from.reply(h.req_id, errc::ok, {});
  }

  // ---- membership -----------------------------------------------------------------------------

  bool has_left(int rank) const { return left_.count(rank) != 0; }
  bool is_dead(int rank) const { return dead_.count(rank) != 0; }

  /// Worker `rank` pushes no more: rounds waiting only for it complete. False if it had left.
  bool worker_left(int rank) {
    if (rank < 0 || !left_.insert(rank).second) return false;
    for (auto& [k, s] : slices_)
      if (!s.round_waiters.empty()) maybe_complete(s);
    return true;
  }

  /// Worker `rank` died (and does not leave the group): rounds waiting fail, and inits waiting
  /// for rank 0's value fail. `why` says who and how, for the errors.
  void worker_dead(int rank, const std::string& why) {
    dead_.insert(rank);
    for (auto& [k, s] : slices_) {
      if (!s.round_waiters.empty()) fail_round(s, why);
      if (!s.inited && rank == 0) {
        for (auto& w : s.init_waiters)
          w.port.reply(w.req_id, errc::node_dead,
                       "key " + key_str(k) + " cannot be inited: " + why);
        s.init_waiters.clear();
      }
    }
  }

  /// Worker `rank`'s connection closed: a push it re-sends on its next one starts again from its
  /// first frame.
  void connection_lost(int rank) {
    for (auto& [k, s] : slices_)
      if (auto it = s.parts.find(rank); it != s.parts.end()) it->second.received = 0;
  }

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
    held_bytes_ = 0;
    for (const auto& entry : slices_)
      held_bytes_ += entry.second.size() * entry.second.elem() + key_overhead_bytes;
    upd_f_ = std::move(f);
    upd_d_ = std::move(d);
    opt_name_ = opt_name;
    opt_params_ = opt_params;
  }

  static std::string key_str(std::uint64_t k) {
    return (k >> 63) ? "(named key id " + std::to_string(k) + ")"
                     : std::to_string(static_cast<std::int64_t>(k));
  }

 private:
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
    if (on_change_) on_change_(important);
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
        s.duplicate(rank, h.aux) || s.round_done.count(rank) || !s.cov.disjoint(rel, rel + n))
      return {};
    if (s.merge.size() != s.size() * s.elem()) s.merge.resize(s.size() * s.elem());
    return {s.merge.data() + rel * s.elem(), static_cast<std::size_t>(h.payload_len)};
  }

  // A compressed push's payload may hold at most the slice's elements in its encoding, in the
  // connection's buffer (push_encoded decodes it; it never goes straight into a round). An
  // encoding this server does not know cannot be sized: its payload is refused unread.
  std::span<std::byte> encoded_sink(const wire::header& h, const slice& s) {
    const wire::encoding e = known_encoding(h, "push", errc::protocol);
    const std::uint64_t limit = wire::encoded_bytes(e, s.size(), s.elem());
    if (h.payload_len > limit)
      throw error(errc::protocol, "a " + std::to_string(h.payload_len) + "-byte " +
                                      wire::encoding_name(e) + " payload for key " +
                                      key_str(h.key) + " that takes at most " +
                                      std::to_string(limit));
    return {};
  }

  // The encoding a push or pull names in its flags; one this server does not know is an error
  // `code` (unsupported: the request is refused, its connection kept).
  static wire::encoding known_encoding(const wire::header& h, const char* what,
                                       errc code = errc::unsupported) {
    const unsigned bits = wire::encoding_bits(h.flags);
    if (bits >= wire::encoding_count)
      throw error(code, "key " + key_str(h.key) + ": a " + what + " in encoding " +
                            std::to_string(bits) + ", which this server does not know (0-" +
                            std::to_string(wire::encoding_count - 1) + ")");
    return static_cast<wire::encoding>(bits);
  }

  slice& find(const wire::header& h) {
    auto it = slices_.find(h.key);
    if (it == slices_.end() || !it->second.inited)
      throw error(errc::unknown_key, "key " + key_str(h.key) + " was never inited on " + who_);
    slice& s = it->second;
    if (h.type != s.type)
      throw error(errc::invalid_argument,
                  "key " + key_str(h.key) + ": element type differs from its init");
    if (h.total != s.total)
      throw error(errc::size_mismatch, "key " + key_str(h.key) + " has " + std::to_string(s.total) +
                                           " elements, the request says " +
                                           std::to_string(h.total));
    return s;
  }

  // Checks that payload elements [offset, offset + n) lie in the slice.
  static std::uint64_t check_range(const slice& s, const wire::header& h, std::size_t payload_len) {
    return check_elements(s, h, payload_len / s.elem());
  }
  static std::uint64_t check_elements(const slice& s, const wire::header& h, std::uint64_t n) {
    if (h.offset < s.lo || h.offset > s.hi || n > s.hi - h.offset)
      throw error(errc::size_mismatch,
                  "key " + key_str(h.key) + ": elements [" + std::to_string(h.offset) + ", " +
                      std::to_string(h.offset + n) + ") are outside this server's slice [" +
                      std::to_string(s.lo) + ", " + std::to_string(s.hi) + ")");
    return n;
  }

  std::vector<std::int64_t> check_rows(const slice& s, const wire::header& h,
                                       std::string_view meta) {
    if (!s.row_length)
      throw error(errc::not_a_matrix, "key " + key_str(h.key) + " was inited without a row length");
    auto rows = wire::decode_rows(meta);
    const auto rlo = static_cast<std::int64_t>(s.lo / s.row_length),
               rhi = static_cast<std::int64_t>(s.hi / s.row_length);
    for (auto r : rows)
      if (r < rlo || r >= rhi)
        throw error(errc::row_out_of_range, "key " + key_str(h.key) + ": row " + std::to_string(r) +
                                                " is outside this server's rows [" +
                                                std::to_string(rlo) + ", " + std::to_string(rhi) +
                                                ")");
    return rows;
  }

  static void refuse_repeated_rows(std::uint64_t key, std::span<const std::int64_t> rows) {
    std::vector<std::int64_t> sorted(rows.begin(), rows.end());
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end())
      throw error(errc::invalid_argument, "key " + key_str(key) + ": pull_rows names row " +
                                              std::to_string(*twice) + " more than once");
  }

  static wire::header data_header(const slice& s, const wire::header& asked) {
    wire::header f;
    f.command = wire::cmd::data;
    f.req_id = asked.req_id;
    f.key = asked.key;
    f.total = s.total;
    f.type = s.type;
    f.priority = asked.priority;
    return f;
  }

  // Adds or copies `n` elements at slice offset `rel` into the round's merge buffer.
  template <class T>
  static void contribute(slice& s, std::uint64_t rel, const T* src, std::uint64_t n) {
    T* m = reinterpret_cast<T*>(s.merge.data());
    s.cov.contribute(
        rel, rel + n,
        [&](std::uint64_t b, std::uint64_t e) {
          if (m + b != src + (b - rel))
            std::memcpy(m + b, src + (b - rel), (e - b) * sizeof(T));  // else read in place
        },
        [&](std::uint64_t b, std::uint64_t e) {
          T* __restrict d = m + b;
          const T* __restrict a = src + (b - rel);
          for (std::uint64_t i = 0; i < e - b; ++i) d[i] += a[i];
        });
  }

  // A worker that left the group (leave, bye) pushes no more: its push is refused, not summed.
  void refuse_if_left(int rank, std::uint64_t key) const {
    if (!left_.count(rank)) return;
    const std::string msg = who_ + " refused a push of key " + key_str(key) + " from worker " +
                            std::to_string(rank) + ": it left the sync group";
    log_warn(who_, msg);
    throw error(errc::invalid_argument, msg);
  }

  void begin_round_push(slice& s, int rank) {
    refuse_if_left(rank, s.key);
    if (s.round_done.count(rank))
      throw error(errc::protocol, "worker " + std::to_string(rank) + " pushed key " +
                                      key_str(s.key) + " twice in round " +
                                      std::to_string(s.round));
    if (s.merge.size() != s.size() * s.elem()) s.merge.resize(s.size() * s.elem());
  }

  void end_round_push(slice& s, int rank, const Port& from, const wire::header& h) {
    s.round_seq[rank] = h.aux;
    s.round_done.insert(rank);
    s.round_waiters.push_back({from, h.req_id});
    if (!dead_.empty()) check_dead(s);
    if (!s.round_waiters.empty()) maybe_complete(s);
  }

  // After each frame of an async push: on its last, the push is applied whole and answered.
  void end_async_frame(slice& s, int rank, const Port& from, const wire::header& h) {
    if (!(h.flags & wire::flag_last)) return;
    s.parts.erase(rank);
    if (h.aux) s.applied[rank] = h.aux;
    changed();  // a snapshot due now is written before the answer: an answered push is kept
    from.reply(h.req_id, errc::ok, {});
  }

  // A push re-sent after a restart that the snapshot already holds: answered, not applied twice.
  static void ack_duplicate(const Port& from, const wire::header& h) {
    if (h.flags & wire::flag_last) from.reply(h.req_id, errc::ok, {});
  }

  // Applies `n` elements at slice offset `rel`: stores them (no optimizer) or updates the
  // weights with them as the gradient.
  template <class T>
  void apply_range(slice& s, const T* grad, std::uint64_t rel, std::uint64_t n, bool new_step) {
    auto& v = s.mutable_value();
    T* w = reinterpret_cast<T*>(v.data()) + rel;
    auto& upd = updater<T>();
    if (!upd) {
      if (n) std::memcpy(w, grad, n * sizeof(T));  // an empty push has no payload pointer
      return;
    }
    auto& st = s.template state<T>();
    upd.ensure_state(st, s.size());
    if (new_step) ++st.step;
    upd.fn(kvstore::key(static_cast<std::int64_t>(s.key)), std::span<const T>(grad, n),
           std::span<T>(w, n), optim::updater<T>::view(st, rel, n));
  }

  template <class T>
  optim::updater<T>& updater() {
    if constexpr (std::is_same_v<T, float>)
      return upd_f_;
    else
      return upd_d_;
  }

  bool round_complete(const slice& s) const {
    for (int r = 0; r < cfg_.num_workers; ++r)
      if (!left_.count(r) && !s.round_done.count(r)) return false;
    return true;
  }

  void maybe_complete(slice& s) {
    if (!round_complete(s)) return;
    with_dtype(s.type, [&]<class T>() {
      auto& upd = updater<T>();
      const auto& ranges = s.cov.ranges();
      if (!upd && ranges.size() == 1 && ranges.begin()->first == 0 &&
          ranges.begin()->second == s.size() && s.value.use_count() == 1) {
        s.value->swap(s.merge);  // the old value becomes the next merge buffer: no copy
      } else {
        bool first = true;
        for (auto [b, e] : ranges) {
          apply_range<T>(s, reinterpret_cast<const T*>(s.merge.data()) + b, b, e - b, first);
          first = false;
        }
      }
    });
    s.cov.clear();
    s.round_done.clear();
    for (auto [r, q] : s.round_seq)
      if (q) s.applied[r] = std::max(s.applied[r], q);
    s.round_seq.clear();
    ++s.round;
    changed();
    for (auto& w : s.round_waiters) w.port.reply(w.req_id, errc::ok, {});
    s.round_waiters.clear();
  }

  void check_dead(slice& s) {
    for (int r : dead_)
      if (!left_.count(r))
        return fail_round(s, "worker " + std::to_string(r) + " (node " +
                                 std::to_string(worker_id(r)) + ") is dead");
  }

  void fail_round(slice& s, const std::string& why) {
    for (auto& w : s.round_waiters)
      w.port.reply(w.req_id, errc::node_dead,
                   "sync round " + std::to_string(s.round) + " of key " + key_str(s.key) +
                       " cannot complete: " + why);
    s.round_waiters.clear();
    s.round_done.clear();
    s.round_seq.clear();
    s.cov.clear();
  }

  shard_config cfg_;
  std::uint64_t held_bytes_ = 0;  // slices' bytes plus key_overhead_bytes each (max_total_bytes)
  change_hook on_change_;
  std::string who_ = "server";
  slice_map slices_;
  optim::updater<float> upd_f_;
  optim::updater<double> upd_d_;
  std::string opt_name_, opt_params_;
  std::set<int> left_, dead_;
  bytes scratch_;  // a compressed async push's frame, decoded (at most a slice's bytes)
};

}  // namespace kvstore::detail
