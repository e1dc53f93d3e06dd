// A server process's loop: registers with the scheduler, accepts workers, keeps its shard of the
// keys (server/shard.hpp), sums a sync round's pushes of all workers and applies the optimizer
// once, answers pulls, and ends when the scheduler says the job is over. Everything runs on one
// io thread, so the shard needs no locks.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/options.hpp>
#include <kvstore/node.hpp>
#include <kvstore/server/checkpoint.hpp>
#include <kvstore/server/shard.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/wire/messages.hpp>
#include <kvstore/wire/meta.hpp>

#include <functional>
#include <unordered_map>

namespace kvstore {

class server final : public transport::frame_handler {
  using conn_ptr = std::shared_ptr<transport::connection>;
  using slice = detail::key_slice<transport::connection>;
  using reply_to = detail::reply_to<transport::connection>;

 public:
  /// What a custom server does with kv.send_command_to_servers(head, body).
  using command_handler = std::function<void(int head, std::string_view body)>;

  /// Binds the listening socket at once. Throws kvstore::error(unreachable) when it cannot.
  explicit server(dist_options o) : opts_(std::move(o)), acceptor_(io_), timer_(io_) {
    std::string host = opts_.bind_host.empty()
                           ? (opts_.token.empty() ? std::string("127.0.0.1") : std::string("0.0.0.0"))
                           : opts_.bind_host;
    try {
      transport::tcp::endpoint ep(transport::asio::ip::make_address(host), 0);
      acceptor_.open(ep.protocol());
      acceptor_.bind(ep);
      acceptor_.listen();
    } catch (const std::exception& e) {
      throw error(errc::unreachable, "server cannot listen on " + host + ": " + e.what());
    }
    transport::tls_context(opts_.security(true));  // a bad TLS file is an error now, not later
    transport::tls_context(opts_.security(false));
    advertise_ = opts_.advertise_host.empty() ? (host == "0.0.0.0" ? std::string() : host)
                                              : opts_.advertise_host;
    if (opts_.token.empty() && host != "127.0.0.1")
      detail::log_warn("server", "no KVSTORE_TOKEN set but listening on " + host);
  }

  /// Registers the hook for send_command_to_servers (call before run()).
  void on_command(command_handler h) { on_command_ = std::move(h); }

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  int rank() const noexcept { return rank_; }

  /// Registers with the scheduler and serves until the job is over. Throws kvstore::error when
  /// the scheduler cannot be reached or is lost before the job ends.
  void run() {
    restore();
    // The scheduler honours a valid rank hint; take it now, so a worker's frame that overtakes the
    // address book (separate connections, one io thread) already sees this server's identity.
    if (opts_.rank_hint >= 0 && opts_.rank_hint < opts_.num_servers) {
      rank_ = opts_.rank_hint;
      id_ = detail::server_id(rank_);
      who_ = "server " + std::to_string(rank_);
    }
    auto sock = transport::connect_with_retry(io_, opts_.scheduler_host, opts_.scheduler_port,
                                              opts_.connect_timeout, "the scheduler");
    sched_ = std::make_shared<transport::connection>(std::move(sock), *this, sched_limits(), opts_.security(false));
    sched_->start();
    transport::out_frame reg;
    reg.h.command = wire::cmd::reg;
    wire::meta_writer w;
    w.u32(static_cast<std::uint32_t>(role::server)).i64(opts_.rank_hint).str(advertise_).u32(port());
    reg.meta = w.take();
    sched_->send(std::move(reg));
    accept();
    tick();
    io_.run();
    if (!failure_.empty()) throw error(errc::node_dead, failure_);
  }

  /// Stops serving (from any thread).
  void stop() {
    transport::asio::post(io_, [this] { finish(""); });
  }

 private:
  wire::limits worker_limits() const {
    wire::limits l;
    l.max_payload = opts_.max_frame_bytes;
    return l;
  }
  static wire::limits sched_limits() {
    wire::limits l;
    l.max_payload = 1 << 20;
    l.max_meta = 16 << 20;
    return l;
  }

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, transport::tcp::socket s) {
      if (ec) return;
      if (workers_.size() >= opts_.max_connections) {
        detail::log_warn(who_, "refused a connection: already " + std::to_string(workers_.size()) +
                                   " (max_connections)");
        boost::system::error_code ig;
        s.close(ig);
        return accept();
      }
      auto c = std::make_shared<transport::connection>(std::move(s), *this, worker_limits(), opts_.security(true),
                                                       opts_.chunk_bytes);
      workers_.insert(c);
      c->start();
      accept();
    });
  }

  void tick() {
    timer_.expires_after(opts_.heartbeat_interval);
    timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || done_) return;
      if (!sched_lost_) {
        transport::out_frame f;
        f.h.command = wire::cmd::heartbeat;
        f.h.sender = id_;
        sched_->send(std::move(f));
      }
      if (opts_.checkpoint_interval.count() > 0 && dirty_ &&
          std::chrono::steady_clock::now() - last_snapshot_ >= opts_.checkpoint_interval)
        snapshot_quietly();
      tick();
    });
  }

  // ---- snapshots --------------------------------------------------------------------------------
  // Loads this rank's snapshot, if there is one, before the server is heard of: a restarted
  // server serves exactly what it saved. A corrupt snapshot stops the server (never half-loaded).
  void restore() {
    if (opts_.checkpoint_dir.empty() || opts_.rank_hint < 0) return;
    const auto path = detail::snapshot_path(opts_.checkpoint_dir, opts_.rank_hint);
    if (!std::filesystem::exists(path)) return;
    auto snap = detail::load_snapshot(path);
    std::unordered_map<std::uint64_t, slice> restored;
    optim::updater<float> f;
    optim::updater<double> d;
    if (!snap.optimizer_name.empty()) {
      f = optim::create_updater<float>(snap.optimizer_name, snap.optimizer_params);
      d = optim::create_updater<double>(snap.optimizer_name, snap.optimizer_params);
    }
    for (auto& x : snap.slices) {
      slice& sl = restored[x.key];
      static_cast<detail::slice_header&>(sl) = x;
      sl.applied.insert(x.applied.begin(), x.applied.end());
      for (auto& p : x.parts) sl.parts[p.rank] = {p.seq, p.frames, 0};
      sl.inited = true;
      sl.restored = true;
      for (int r = 0; r < opts_.num_workers; ++r) sl.init_done.insert(r);
      auto* p = reinterpret_cast<const std::byte*>(x.value.data());
      sl.value = std::make_shared<detail::bytes>(p, p + x.value.size());
      detail::with_dtype(x.type, [&]<class T>() {
        auto& st = state<T>(sl);
        st.step = x.step;
        for (auto& raw : x.slots) {
          std::vector<T> v(raw.size() / sizeof(T));
          std::memcpy(v.data(), raw.data(), raw.size());
          st.slots.push_back(std::move(v));
        }
      });
    }
    slices_ = std::move(restored);
    upd_f_ = std::move(f);
    upd_d_ = std::move(d);
    opt_name_ = snap.optimizer_name;
    opt_params_ = snap.optimizer_params;
    detail::log_warn("server " + std::to_string(opts_.rank_hint),
                     "restored " + std::to_string(slices_.size()) + " key slice(s) from " + path.string());
  }

  // Writes the shard's snapshot (atomically). Throws kvstore::error on I/O failure.
  void snapshot() {
    if (opts_.checkpoint_dir.empty())
      throw error(errc::unsupported, who_ + " has no checkpoint directory (KVSTORE_CHECKPOINT_DIR)");
    detail::shard_snapshot snap;
    snap.rank = rank_;
    snap.optimizer_name = opt_name_;
    snap.optimizer_params = opt_params_;
    for (auto& kv : slices_) {
      const slice& sl = kv.second;
      if (!sl.inited) continue;
      detail::slice_snapshot x;
      static_cast<detail::slice_header&>(x) = sl;
      x.applied.assign(sl.applied.begin(), sl.applied.end());
      for (auto& [rank, p] : sl.parts) x.parts.push_back({rank, p.seq, p.applied});
      x.value.assign(reinterpret_cast<const char*>(sl.value->data()), sl.value->size());
      detail::with_dtype(sl.type, [&]<class T>() {
        const auto& st = state<T>(kv.second);
        x.step = st.step;
        for (auto& v : st.slots) x.slots.emplace_back(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
      });
      snap.slices.push_back(std::move(x));
    }
    std::filesystem::create_directories(opts_.checkpoint_dir);
    detail::save_snapshot(detail::snapshot_path(opts_.checkpoint_dir, rank_), snap);
    dirty_ = false;
    changes_ = 0;
    last_snapshot_ = std::chrono::steady_clock::now();
    ++snapshots_;
  }
  void snapshot_quietly() {
    try {
      snapshot();
    } catch (const std::exception& e) {
      detail::log_warn(who_, std::string("snapshot failed: ") + e.what());
    }
  }
  // Something changed: snapshot now if the count says so.
  void changed(bool important = false) {
    dirty_ = true;
    ++changes_;
    if (opts_.checkpoint_dir.empty()) return;
    if (important || (opts_.checkpoint_rounds && changes_ >= opts_.checkpoint_rounds)) snapshot_quietly();
  }

  // ---- frames ---------------------------------------------------------------------------------
  // Checked before the payload is allocated: a frame may only carry as many bytes as its key's
  // slice (or its command) can take; anything more closes that connection.
  std::span<std::byte> payload_sink(transport::connection& c, const wire::header& h) override {
    if (h.payload_len == 0 || &c == sched_.get()) return {};
    const std::size_t elem = wire::dtype_size(h.type);
    auto too_big = [&](std::uint64_t limit) {
      if (h.payload_len > limit)
        throw error(errc::protocol, "a " + std::to_string(h.payload_len) + "-byte payload for key " + key_str(h.key) +
                                        " that takes at most " + std::to_string(limit));
    };
    switch (h.command) {
      case wire::cmd::init:
        if (!elem || h.total > opts_.max_frame_bytes / elem) throw error(errc::protocol, "init payload without a valid size");
        too_big(h.total * elem);
        return {};
      case wire::cmd::push:
      case wire::cmd::push_rows: {
        auto it = slices_.find(h.key);
        if (it == slices_.end() || it->second.type != h.type) {
          too_big(0);  // never inited here: no payload is acceptable
          return {};
        }
        too_big(it->second.size() * it->second.elem());
        if (h.command == wire::cmd::push) return direct_sink(c, h, it->second);
        return {};
      }
      case wire::cmd::load_states: return {};
      default: too_big(0); return {};
    }
  }

  // A sync push from the only worker still in the group, into a part of the round not written
  // yet, is read straight into the round's merge buffer: no staging buffer, no copy (contribute
  // sees the data already in place). With several workers their frames could interleave with a
  // read in progress, so they are staged.
  std::span<std::byte> direct_sink(transport::connection& c, const wire::header& h, slice& s) {
    if (!opts_.sync || !s.inited || h.total != s.total || h.offset < s.lo || h.payload_len % s.elem()) return {};
    const std::uint64_t rel = h.offset - s.lo, n = h.payload_len / s.elem();
    if (rel > s.size() || n > s.size() - rel || active_workers() != 1 || s.duplicate(c.peer_rank, h.aux) ||
        s.round_done.count(c.peer_rank) || !s.cov.disjoint(rel, rel + n))
      return {};
    if (s.merge.size() != s.size() * s.elem()) s.merge.resize(s.size() * s.elem());
    return {s.merge.data() + rel * s.elem(), static_cast<std::size_t>(h.payload_len)};
  }

  int active_workers() const {
    int n = 0;
    for (int r = 0; r < opts_.num_workers; ++r) n += !left_.count(r);
    return n;
  }

  void on_frame(transport::connection& c, const wire::header& h, std::string meta,
                std::span<const std::byte> payload) override {
    if (&c == sched_.get()) return on_scheduler(h, meta);
    if (c.peer_id < 0) {
      if (h.command != wire::cmd::hello) throw error(errc::protocol, "first frame must be hello");
      if (h.aux >= static_cast<std::uint64_t>(opts_.num_workers))
        throw error(errc::protocol, "hello from worker rank " + std::to_string(h.aux) +
                                        " but the job has " + std::to_string(opts_.num_workers));
      c.peer_rank = static_cast<int>(h.aux);
      c.peer_id = detail::worker_id(c.peer_rank);
      c.peer_role = static_cast<int>(role::worker);
      return;
    }
    try {
      handle(c, h, meta, payload);
    } catch (const error& e) {
      if (e.code() == make_error_code(errc::protocol)) throw;
      reply(c, h.req_id, static_cast<errc>(e.code().value()), e.what());
    }
  }

  void on_scheduler(const wire::header& h, const std::string& meta) {
    switch (h.command) {
      case wire::cmd::address_book:
        id_ = static_cast<int>(h.key);
        rank_ = static_cast<int>(h.aux);
        who_ = "server " + std::to_string(rank_);
        detail::log_info(who_, "serving on port " + std::to_string(port()));
        return;
      case wire::cmd::response:
        if (h.status != 0) return finish("the scheduler refused this server: " + meta);
        return;
      case wire::cmd::shutdown:
        return finish("");
      case wire::cmd::node_dead:
        return worker_gone(static_cast<int>(h.key), "died (" + meta + ")");
      case wire::cmd::leave:
        return worker_left(static_cast<int>(h.aux));
      default:
        return;
    }
  }

  void handle(transport::connection& c, const wire::header& h, const std::string& meta,
              std::span<const std::byte> payload) {
    switch (h.command) {
      case wire::cmd::init: return do_init(c, h, meta, payload);
      case wire::cmd::push: return do_push(c, h, payload);
      case wire::cmd::push_rows: return do_push_rows(c, h, meta, payload);
      case wire::cmd::pull: return do_pull(c, h);
      case wire::cmd::pull_rows: return do_pull_rows(c, h, meta);
      case wire::cmd::set_optimizer: return do_set_optimizer(c, h, meta);
      case wire::cmd::command: return do_command(c, h, meta);
      case wire::cmd::save_states: return do_save_states(c, h);
      case wire::cmd::load_states: return do_load_states(c, h, payload);
      case wire::cmd::leave:
        reply(c, h.req_id, errc::ok, {});
        return worker_left(c.peer_rank);
      case wire::cmd::bye:
        // A worker that is done pushes no more: the others' rounds go on without it.
        c.said_bye = true;
        reply(c, h.req_id, errc::ok, {});
        return worker_left(c.peer_rank);
      case wire::cmd::heartbeat: return;
      case wire::cmd::checkpoint:
        snapshot();
        return reply(c, h.req_id, errc::ok, {});
      default:
        throw error(errc::protocol, "unexpected command " + std::to_string(static_cast<int>(h.command)));
    }
  }

  static std::string key_str(std::uint64_t k) {
    return (k >> 63) ? "(named key id " + std::to_string(k) + ")"
                     : std::to_string(static_cast<std::int64_t>(k));
  }

  slice& find(const wire::header& h) {
    auto it = slices_.find(h.key);
    if (it == slices_.end() || !it->second.inited)
      throw error(errc::unknown_key, "key " + key_str(h.key) + " was never inited on " + who_);
    slice& s = it->second;
    if (h.type != s.type)
      throw error(errc::invalid_argument, "key " + key_str(h.key) + ": element type differs from its init");
    if (h.total != s.total)
      throw error(errc::size_mismatch, "key " + key_str(h.key) + " has " + std::to_string(s.total) +
                                           " elements, the request says " + std::to_string(h.total));
    return s;
  }

  // Checks that payload elements [offset, offset + n) lie in the slice.
  static std::uint64_t check_range(const slice& s, const wire::header& h, std::size_t payload_len) {
    const std::uint64_t n = payload_len / s.elem();
    if (h.offset < s.lo || h.offset > s.hi || n > s.hi - h.offset)
      throw error(errc::size_mismatch, "key " + key_str(h.key) + ": elements [" + std::to_string(h.offset) +
                                           ", " + std::to_string(h.offset + n) + ") are outside this server's slice [" +
                                           std::to_string(s.lo) + ", " + std::to_string(s.hi) + ")");
    return n;
  }

  void do_init(transport::connection& c, const wire::header& h, const std::string& meta,
               std::span<const std::byte> payload) {
    const auto [lo, hi] = wire::decode_init_meta(meta);
    const std::uint64_t rl = h.aux;
    if (h.type != wire::dtype::f32 && h.type != wire::dtype::f64)
      throw error(errc::invalid_argument, "key " + key_str(h.key) + ": init without an element type");
    // (hi - lo) * element size must not wrap: a wrapped size allocates a short value that later
    // writes overrun (found by fuzz/fuzz_server.cpp).
    if (h.total == 0 || lo >= hi || hi > h.total || (rl && (h.total % rl || lo % rl || hi % rl)) ||
        hi - lo > std::numeric_limits<std::size_t>::max() / 8)
      throw error(errc::invalid_argument, "key " + key_str(h.key) + ": bad slice [" + std::to_string(lo) +
                                              ", " + std::to_string(hi) + ") of " + std::to_string(h.total));
    if ((hi - lo) > opts_.max_key_bytes / wire::dtype_size(h.type))
      throw error(errc::invalid_argument, "key " + key_str(h.key) + ": a slice of " + std::to_string(hi - lo) +
                                              " elements is more than this server's max_key_bytes (" +
                                              std::to_string(opts_.max_key_bytes) + ")");
    auto [it, fresh] = slices_.try_emplace(h.key);
    slice& s = it->second;
    if (fresh) {
      s.key = h.key;
      s.type = h.type;
      s.total = h.total;
      s.lo = lo;
      s.hi = hi;
      s.row_length = rl;
      s.value = std::make_shared<detail::bytes>((hi - lo) * s.elem());
    } else if (s.type != h.type || s.total != h.total || s.lo != lo || s.hi != hi || s.row_length != rl) {
      throw error(errc::size_mismatch, "key " + key_str(h.key) + ": init with " + std::to_string(h.total) +
                                           " elements (row length " + std::to_string(rl) + ") but it was inited with " +
                                           std::to_string(s.total) + " (row length " + std::to_string(s.row_length) + ")");
    }
    const int rank = c.peer_rank;
    if (s.restored && s.inited) {
      // Restored from a snapshot: an init re-sent after the restart is answered, not refused.
      if (h.flags & wire::flag_last) reply(c, h.req_id, errc::ok, {});
      return;
    }
    if (s.init_done.count(rank) || ((h.flags & wire::flag_has_data) && s.inited))
      throw error(errc::already_inited, "key " + key_str(h.key) + " is already inited");
    if (h.flags & wire::flag_has_data) {
      const std::uint64_t n = check_range(s, h, payload.size());
      if (n) std::memcpy(s.value->data() + (h.offset - s.lo) * s.elem(), payload.data(), n * s.elem());
    }
    if (!(h.flags & wire::flag_last)) return;
    s.init_done.insert(rank);
    reply_to me{weak(c), h.req_id};
    if (h.flags & wire::flag_has_data) {
      s.inited = true;
      changed(true);
      for (auto& w : s.init_waiters) reply(w, errc::ok, {});
      s.init_waiters.clear();
      reply(me, errc::ok, {});
    } else if (s.inited) {
      reply(me, errc::ok, {});
    } else {
      s.init_waiters.push_back(me);
    }
  }

  std::weak_ptr<transport::connection> weak(transport::connection& c) {
    return c.shared_from_this();
  }

  // Adds or copies `n` elements at slice offset `rel` into the round's merge buffer.
  template <class T>
  static void contribute(slice& s, std::uint64_t rel, const T* src, std::uint64_t n) {
    T* m = reinterpret_cast<T*>(s.merge.data());
    s.cov.contribute(
        rel, rel + n,
        [&](std::uint64_t b, std::uint64_t e) {
          if (m + b != src + (b - rel)) std::memcpy(m + b, src + (b - rel), (e - b) * sizeof(T));  // else read in place
        },
        [&](std::uint64_t b, std::uint64_t e) {
          T* __restrict d = m + b;
          const T* __restrict a = src + (b - rel);
          for (std::uint64_t i = 0; i < e - b; ++i) d[i] += a[i];
        });
  }

  void begin_round_push(slice& s, int rank) {
    if (s.round_done.count(rank))
      throw error(errc::protocol, "worker " + std::to_string(rank) + " pushed key " + key_str(s.key) +
                                      " twice in round " + std::to_string(s.round));
    if (s.merge.size() != s.size() * s.elem()) s.merge.resize(s.size() * s.elem());
  }

  void do_push(transport::connection& c, const wire::header& h, std::span<const std::byte> payload) {
    slice& s = find(h);
    const std::uint64_t n = check_range(s, h, payload.size());
    if (s.duplicate(c.peer_rank, h.aux)) return ack_duplicate(c, h);
    const std::uint64_t rel = h.offset - s.lo;
    if (opts_.sync) {
      begin_round_push(s, c.peer_rank);
      detail::with_dtype(s.type, [&]<class T>() { contribute<T>(s, rel, reinterpret_cast<const T*>(payload.data()), n); });
      if (h.flags & wire::flag_last) end_round_push(s, c, h);
      return;
    }
    bool first = true;
    if (s.take_async_frame(c.peer_rank, h.aux, (h.flags & wire::flag_last) != 0, first))
      detail::with_dtype(s.type, [&]<class T>() {
        apply_range<T>(s, reinterpret_cast<const T*>(payload.data()), rel, n, /*new_step=*/first);
      });
    end_async_frame(s, c, h);
  }

  // After each frame of an async push: on its last, the push is applied whole and answered.
  void end_async_frame(slice& s, transport::connection& c, const wire::header& h) {
    if (!(h.flags & wire::flag_last)) return;
    s.parts.erase(c.peer_rank);
    if (h.aux) s.applied[c.peer_rank] = h.aux;
    changed();  // a snapshot due now is written before the answer: an answered push is kept
    reply(c, h.req_id, errc::ok, {});
  }

  // A push re-sent after a restart that the snapshot already holds: answered, not applied twice.
  void ack_duplicate(transport::connection& c, const wire::header& h) {
    if (h.flags & wire::flag_last) reply(c, h.req_id, errc::ok, {});
  }

  void end_round_push(slice& s, transport::connection& c, const wire::header& h) {
    s.round_seq[c.peer_rank] = h.aux;
    s.round_done.insert(c.peer_rank);
    s.round_waiters.push_back({weak(c), h.req_id});
    if (!dead_.empty()) check_dead(s);
    if (!s.round_waiters.empty()) maybe_complete(s);
  }

  std::vector<std::int64_t> check_rows(const slice& s, const wire::header& h, const std::string& meta) {
    if (!s.row_length)
      throw error(errc::not_a_matrix, "key " + key_str(h.key) + " was inited without a row length");
    auto rows = wire::decode_rows(meta);
    const auto rlo = static_cast<std::int64_t>(s.lo / s.row_length), rhi = static_cast<std::int64_t>(s.hi / s.row_length);
    for (auto r : rows)
      if (r < rlo || r >= rhi)
        throw error(errc::row_out_of_range, "key " + key_str(h.key) + ": row " + std::to_string(r) +
                                                " is outside this server's rows [" + std::to_string(rlo) + ", " +
                                                std::to_string(rhi) + ")");
    return rows;
  }

  void do_push_rows(transport::connection& c, const wire::header& h, const std::string& meta,
                    std::span<const std::byte> payload) {
    slice& s = find(h);
    auto rows = check_rows(s, h, meta);
    if (s.duplicate(c.peer_rank, h.aux)) return ack_duplicate(c, h);
    const std::uint64_t rl = s.row_length;
    if (payload.size() != rows.size() * rl * s.elem())
      throw error(errc::size_mismatch, "key " + key_str(h.key) + ": " + std::to_string(rows.size()) +
                                           " rows need " + std::to_string(rows.size() * rl) + " values");
    if (opts_.sync) {
      begin_round_push(s, c.peer_rank);
      detail::with_dtype(s.type, [&]<class T>() {
        const T* src = reinterpret_cast<const T*>(payload.data());
        for (std::size_t i = 0; i < rows.size(); ++i)
          contribute<T>(s, static_cast<std::uint64_t>(rows[i]) * rl - s.lo, src + i * rl, rl);
      });
      if (h.flags & wire::flag_last) end_round_push(s, c, h);
      return;
    }
    // Async: duplicates in one message are summed first, then each row applied.
    bool first = true;
    if (s.take_async_frame(c.peer_rank, h.aux, (h.flags & wire::flag_last) != 0, first))
      detail::with_dtype(s.type, [&]<class T>() {
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
    end_async_frame(s, c, h);
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
    auto& st = state<T>(s);
    upd.ensure_state(st, s.size());
    if (new_step) ++st.step;
    upd.fn(kvstore::key(static_cast<std::int64_t>(s.key)), std::span<const T>(grad, n), std::span<T>(w, n),
           optim::updater<T>::view(st, rel, n));
  }

  template <class T>
  optim::updater<T>& updater() {
    if constexpr (std::is_same_v<T, float>) return upd_f_;
    else return upd_d_;
  }
  template <class T>
  static optim::state<T>& state(slice& s) {
    if constexpr (std::is_same_v<T, float>) return s.st_f;
    else return s.st_d;
  }

  bool round_complete(const slice& s) const {
    for (int r = 0; r < opts_.num_workers; ++r)
      if (!left_.count(r) && !s.round_done.count(r)) return false;
    return true;
  }

  void maybe_complete(slice& s) {
    if (!round_complete(s)) return;
    detail::with_dtype(s.type, [&]<class T>() {
      auto& upd = updater<T>();
      const auto& ranges = s.cov.ranges();
      if (!upd && ranges.size() == 1 && ranges.begin()->first == 0 && ranges.begin()->second == s.size() &&
          s.value.use_count() == 1) {
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
    for (auto& w : s.round_waiters) reply(w, errc::ok, {});
    s.round_waiters.clear();
  }

  void do_pull(transport::connection& c, const wire::header& h) {
    slice& s = find(h);
    const std::size_t chunk = std::max<std::size_t>(1, opts_.chunk_bytes / s.elem());
    auto keep = s.value;
    for (std::uint64_t off = 0; off < s.size(); off += chunk) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk, s.size() - off);
      transport::out_frame f;
      f.h.command = wire::cmd::data;
      f.h.req_id = h.req_id;
      f.h.key = h.key;
      f.h.offset = s.lo + off;
      f.h.total = s.total;
      f.h.type = s.type;
      f.h.priority = h.priority;
      f.h.sender = id_;
      if (off + n == s.size()) f.h.flags = wire::flag_last;
      f.payload = keep->data() + off * s.elem();
      f.payload_len = n * s.elem();
      f.keep = keep;
      c.send(std::move(f));
    }
  }

  void do_pull_rows(transport::connection& c, const wire::header& h, const std::string& meta) {
    slice& s = find(h);
    auto rows = check_rows(s, h, meta);
    const std::uint64_t rl = s.row_length, row_bytes = rl * s.elem();
    const std::size_t per = std::max<std::size_t>(1, opts_.chunk_bytes / std::max<std::uint64_t>(row_bytes, 1));
    std::size_t i = 0;
    do {
      const std::size_t n = std::min(per, rows.size() - i);
      auto buf = std::make_shared<detail::bytes>(n * row_bytes);
      for (std::size_t j = 0; j < n; ++j)
        std::memcpy(buf->data() + j * row_bytes,
                    s.value->data() + (static_cast<std::uint64_t>(rows[i + j]) * rl - s.lo) * s.elem(), row_bytes);
      transport::out_frame f;
      f.h.command = wire::cmd::data;
      f.h.req_id = h.req_id;
      f.h.key = h.key;
      f.h.offset = i;  // index of the first row in the request's list
      f.h.total = s.total;
      f.h.type = s.type;
      f.h.priority = h.priority;
      f.h.sender = id_;
      f.h.flags = wire::flag_rows | (i + n == rows.size() ? wire::flag_last : 0u);
      f.payload = buf->data();
      f.payload_len = buf->size();
      f.keep = buf;
      c.send(std::move(f));
      i += n;
    } while (i < rows.size());
  }

  void do_set_optimizer(transport::connection& c, const wire::header& h, const std::string& meta) {
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
    detail::log_info(who_, "optimizer set: " + name);
    reply(c, h.req_id, errc::ok, {});
  }

  void do_command(transport::connection& c, const wire::header& h, const std::string& meta) {
    if (!on_command_)
      throw error(errc::unsupported, who_ + " has no command handler (server::on_command)");
    try {
      on_command_(static_cast<int>(static_cast<std::int64_t>(h.key)), meta);
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      throw error(errc::server_error, who_ + ": command " + std::to_string(static_cast<std::int64_t>(h.key)) +
                                          " failed: " + e.what());
    }
    reply(c, h.req_id, errc::ok, {});
  }

  // The shard's optimizer states: per key slice u64 key | u32 dtype | u64 lo | u64 hi |
  // u64 total | u64 step | u32 slots, then the slots' raw elements.
  void do_save_states(transport::connection& c, const wire::header& h) {
    auto out = std::make_shared<detail::bytes>();
    std::uint64_t count = 0;
    for (auto& kv : slices_) {
      const std::uint64_t k = kv.first;
      slice& s = kv.second;
      if (!s.inited) continue;
      detail::with_dtype(s.type, [&]<class T>() {
        auto& st = state<T>(s);
        if (st.slots.empty() && st.step == 0) return;
        wire::meta_writer w;
        w.u64(k).u32(static_cast<std::uint32_t>(s.type)).u64(s.lo).u64(s.hi).u64(s.total).u64(st.step)
            .u32(static_cast<std::uint32_t>(st.slots.size()));
        auto head = w.take();
        auto* p = reinterpret_cast<const std::byte*>(head.data());
        out->insert(out->end(), p, p + head.size());
        for (auto& sl : st.slots) {
          auto* q = reinterpret_cast<const std::byte*>(sl.data());
          out->insert(out->end(), q, q + sl.size() * sizeof(T));
        }
        ++count;
      });
    }
    transport::out_frame f;
    f.h.command = wire::cmd::response;
    f.h.req_id = h.req_id;
    f.h.sender = id_;
    f.h.aux = count;
    f.payload = out->data();
    f.payload_len = out->size();
    f.keep = out;
    c.send(std::move(f));
  }

  // Replaces the shard's optimizer states with those in `payload` (do_save_states' format);
  // everything is checked before anything changes.
  void do_load_states(transport::connection& c, const wire::header& h, std::span<const std::byte> payload) {
    struct staged {
      slice* s;
      optim::state<float> f;
      optim::state<double> d;
    };
    std::vector<staged> all;
    // Validated whole (types, ranges, sizes against the bytes present) before anything changes.
    for (const auto& e : wire::decode_states({reinterpret_cast<const char*>(payload.data()), payload.size()})) {
      const std::uint64_t k = e.key, lo = e.lo, hi = e.hi, total = e.total;
      const auto t = e.type;
      const std::uint32_t nslots = e.nslots;
      auto it = slices_.find(k);
      if (it == slices_.end() || !it->second.inited)
        throw error(errc::unknown_key, "optimizer states name key " + key_str(k) + ", unknown on " + who_);
      slice& s = it->second;
      if (s.type != t || s.lo != lo || s.hi != hi || s.total != total || nslots > optim::max_slots)
        throw error(errc::size_mismatch, "optimizer states of key " + key_str(k) + " do not match its slice on " + who_);
      staged st{&s, {}, {}};
      detail::with_dtype(t, [&]<class T>() {
        optim::state<T>& dst = [&]() -> optim::state<T>& {
          if constexpr (std::is_same_v<T, float>) return st.f;
          else return st.d;
        }();
        dst.step = e.step;
        dst.slots.resize(nslots);
        for (std::uint32_t i = 0; i < nslots; ++i) {
          auto raw = e.slot(i);
          dst.slots[i].resize(hi - lo);
          std::memcpy(dst.slots[i].data(), raw.data(), raw.size());
        }
      });
      all.push_back(std::move(st));
    }
    for (auto& st : all) {
      st.s->st_f = std::move(st.f);
      st.s->st_d = std::move(st.d);
    }
    reply(c, h.req_id, errc::ok, {});
  }

  void check_dead(slice& s) {
    for (int r : dead_)
      if (!left_.count(r)) return fail_round(s, "worker " + std::to_string(r) + " (node " +
                                                    std::to_string(detail::worker_id(r)) + ") is dead");
  }

  void fail_round(slice& s, const std::string& why) {
    for (auto& w : s.round_waiters)
      reply(w, errc::node_dead, "sync round " + std::to_string(s.round) + " of key " + key_str(s.key) +
                                    " cannot complete: " + why);
    s.round_waiters.clear();
    s.round_done.clear();
    s.round_seq.clear();
    s.cov.clear();
  }

  void worker_gone(int id, const std::string& why) {
    if (id < 9 || id % 2 == 0) return;  // only workers matter to a server's rounds
    const int rank = (id - 9) / 2;
    if (left_.count(rank) || dead_.count(rank)) return;
    const std::string msg = "worker " + std::to_string(rank) + " (node " + std::to_string(id) + ") " + why;
    if (opts_.on_worker_death == worker_death::leave_group) {
      detail::log_warn(who_, msg + ": it leaves the sync group");
      return worker_left(rank);
    }
    dead_.insert(rank);
    for (auto& [k, s] : slices_) {
      if (!s.round_waiters.empty()) fail_round(s, msg);
      if (!s.inited && rank == 0) {
        for (auto& w : s.init_waiters)
          reply(w, errc::node_dead, "key " + key_str(k) + " cannot be inited: " + msg);
        s.init_waiters.clear();
      }
    }
  }

  void worker_left(int rank) {
    if (rank < 0 || !left_.insert(rank).second) return;
    detail::log_info(who_, "worker " + std::to_string(rank) + " left the sync group");
    for (auto& [k, s] : slices_)
      if (!s.round_waiters.empty()) maybe_complete(s);
  }

  void on_close(transport::connection& c, const std::string& reason) override {
    if (&c == sched_.get()) {
      // Training needs no scheduler: serve on, and end once the workers are gone.
      if (done_) return;
      sched_lost_ = true;
      detail::log_warn(who_, "lost the scheduler (" + reason + "); serving on until the workers leave");
      if (workers_.empty()) finish("");
      return;
    }
    std::shared_ptr<transport::connection> self;
    for (auto it = workers_.begin(); it != workers_.end(); ++it)
      if (it->get() == &c) {
        self = *it;
        workers_.erase(it);
        break;
      }
    if (done_) return;
    if (c.peer_rank >= 0)
      // A push re-sent on its next connection starts again from its first frame.
      for (auto& [k, s] : slices_)
        if (auto it = s.parts.find(c.peer_rank); it != s.parts.end()) it->second.received = 0;
    if (sched_lost_ && workers_.empty()) return finish("");
    if (c.peer_id < 0) {
      detail::log_warn(who_, "dropped connection from " + c.remote() + ": " + reason);
      return;
    }
    if (!c.said_bye) {
      detail::log_warn(who_, detail::node_name(c.peer_id) + " disconnected: " + reason);
      worker_gone(c.peer_id, "disconnected (" + reason + ")");
    }
  }

  void reply(transport::connection& c, std::uint64_t req, errc status, std::string msg) {
    transport::out_frame f;
    f.h.command = wire::cmd::response;
    f.h.req_id = req;
    f.h.status = static_cast<std::uint32_t>(status);
    f.h.sender = id_;
    f.meta = std::move(msg);
    c.send(std::move(f));
  }
  void reply(const reply_to& to, errc status, std::string msg) {
    if (auto c = to.conn.lock()) reply(*c, to.req_id, status, std::move(msg));
  }

  void finish(const std::string& why) {
    if (done_) return;
    done_ = true;
    failure_ = why;
    if (!why.empty()) detail::log_warn(who_, why);
    boost::system::error_code ec;
    acceptor_.close(ec);
    timer_.cancel();
    for (auto& c : workers_) c->close("server shutting down");
    if (sched_) sched_->close("server shutting down");
    transport::asio::post(io_, [this] { io_.stop(); });
  }

  dist_options opts_;
  transport::asio::io_context io_;
  transport::tcp::acceptor acceptor_;
  transport::asio::steady_timer timer_;
  std::string advertise_;
  conn_ptr sched_;
  std::set<conn_ptr> workers_;
  std::unordered_map<std::uint64_t, slice> slices_;
  optim::updater<float> upd_f_;
  optim::updater<double> upd_d_;
  std::string opt_name_, opt_params_;
  bool dirty_ = false;
  std::uint64_t changes_ = 0, snapshots_ = 0;
  std::chrono::steady_clock::time_point last_snapshot_ = std::chrono::steady_clock::now();
  bool sched_lost_ = false;
  command_handler on_command_;
  std::set<int> left_, dead_;
  int id_ = -1, rank_ = -1;
  std::string who_ = "server";
  bool done_ = false;
  std::string failure_;
};

}  // namespace kvstore
