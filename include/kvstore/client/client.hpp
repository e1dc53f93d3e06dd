// A worker's network side: joins the job through the scheduler, connects to every server, sends
// requests (one or more frames sharing a request id) and completes them when their answers come
// back, within a deadline. Pull answers are read straight into the caller's buffer. A lost server
// or scheduler fails that peer's requests at once with an error naming it; a silent one fails
// them at their deadline.
#pragma once

#include <kvstore/client/call.hpp>
#include <kvstore/client/pending.hpp>
#include <kvstore/detail/block_pool.hpp>
#include <kvstore/detail/log.hpp>
#include <kvstore/detail/spin_mutex.hpp>
#include <kvstore/node.hpp>
#include <kvstore/op.hpp>
#include <kvstore/options.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/identity.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <unordered_map>

namespace kvstore::detail {

/// Where a worker's own server listens in a colocated job (dist_options::colocated), as that
/// server registers it: the scheduler gives the worker its server's rank.
struct own_server {
  std::string host;
  std::uint16_t port = 0;
};

class worker_client final : public transport::frame_handler {
  using clock = std::chrono::steady_clock;

 public:
  static constexpr int to_scheduler = request_table::to_scheduler;

  /// One request (client/pending.hpp).
  using request = pending_request;

  /// Joins the job: registers with the scheduler, waits for the address book, connects to every
  /// server. Throws kvstore::error naming what could not be reached within connect_timeout.
  explicit worker_client(dist_options o, own_server colocated = {})
      : opts_(std::move(o)), own_(std::move(colocated)), timer_(io_), work_(io_.get_executor()) {
    thread_ = std::thread([this] { io_.run(); });
    try {
      join();
    } catch (...) {
      stop_io();
      throw;
    }
  }

  worker_client(const worker_client&) = delete;
  worker_client& operator=(const worker_client&) = delete;
  ~worker_client() { stop_io(); }

  int rank() const noexcept { return rank_; }
  int id() const noexcept { return id_; }
  int num_workers() const noexcept { return num_workers_; }
  int num_servers() const noexcept { return static_cast<int>(servers_.size()); }
  const dist_options& options() const noexcept { return opts_; }

  /// Sends `frames` (all given the request's id) to server `peer` (or to_scheduler) and
  /// completes `r` when the answer (the response, or the data frame flagged last) arrives,
  /// the peer is lost, or the deadline passes. Thread-safe.
  void send(int peer, std::vector<transport::out_frame> frames, request&& r) {
    send_frames(peer, std::span<transport::out_frame>(frames), std::move(r));
  }
  /// The same for a request of one frame (no vector of its own: most of a one-key op's).
  void send(int peer, transport::out_frame frame, request&& r) {
    send_frames(peer, std::span<transport::out_frame>(&frame, 1), std::move(r));
  }

  /// What a store holds back for a server and must send before any later frame to it (small-key
  /// fusion's waiting pushes: client/fusion.hpp), so that none overtakes it on the connection.
  struct send_hook {
    virtual void before_send(int peer) = 0;

   protected:
    ~send_hook() = default;
  };
  /// Sets the hook that send() runs first for a request to a server, kept alive by the client
  /// until it is destroyed. Set while nothing sends: after construction, before the store's
  /// first op; never changed after.
  void set_before_send(std::shared_ptr<send_hook> h) noexcept { before_send_ = std::move(h); }

 private:
  // `r` is taken by reference and moved once, into the table: a request is about 250 bytes.
  void send_frames(int peer, std::span<transport::out_frame> frames, request&& r) {
    if (peer != to_scheduler && before_send_) before_send_->before_send(peer);
    std::shared_ptr<transport::connection> c;
    std::string down;
    std::uint64_t id;
    bool alone = false;  // nothing else in flight to this server: write from this thread
    for (auto& f : frames) f.h.sender = id_;
    {
      std::lock_guard lk(m_);
      id = pending_.next_ids();
      for (auto& f : frames) f.h.req_id = id;
      const bool to_server = peer != to_scheduler;
      c = to_server ? servers_[static_cast<std::size_t>(peer)].conn : sched_;
      down = to_server ? servers_[static_cast<std::size_t>(peer)].down : sched_down_;
      const bool waiting = to_server && servers_[static_cast<std::size_t>(peer)].waiting;
      if (down.empty()) {
        // Held for a re-send while a lost server may come back (and while it is away).
        if (to_server && opts_.server_restart_wait.count() > 0)
          r.frames.assign(frames.begin(), frames.end());
        alone = pending_.add(id, peer, std::move(r), clock::now(), opts_.request_timeout) == 0 &&
                to_server && frames.size() == 1;
        if (waiting) return;  // sent when the server is back
      }
    }
    if (!down.empty()) {
      r.done->complete_part(
          std::make_exception_ptr(error(errc::node_dead, r.what.str() + ": " + down)));
      return;
    }
    for (auto& f : frames) c->send(std::move(f), alone);
  }

 public:
  /// Sends one frame that n requests share (a batch_push flagged flag_each: key i answered by
  /// a response to the frame's req_id + i): request i completes with that answer. For fused
  /// one-key pushes (client/fusion.hpp), which are not kept for a re-send after a server
  /// restart (fusion is off when server_restart_wait is set). Thread-safe.
  void send_each(int peer, transport::out_frame frame, std::vector<request> rs) {
    std::shared_ptr<transport::connection> c;
    std::string down;
    bool alone = false;
    frame.h.sender = id_;
    {
      std::lock_guard lk(m_);
      auto& srv = servers_[static_cast<std::size_t>(peer)];
      c = srv.conn;
      down = srv.down;
      if (down.empty() && srv.waiting) down = srv.lost_why;  // (no re-send without frames)
      if (down.empty()) {
        const std::uint64_t first = pending_.next_ids(rs.size());
        frame.h.req_id = first;
        const auto now = clock::now();
        alone = pending_.in_flight(peer) == 0;
        for (std::size_t i = 0; i < rs.size(); ++i)
          pending_.add(first + i, peer, std::move(rs[i]), now, opts_.request_timeout);
      }
    }
    if (!down.empty()) {
      for (auto& r : rs)
        r.done->complete_part(
            std::make_exception_ptr(error(errc::node_dead, r.what.str() + ": " + down)));
      return;
    }
    c->send(std::move(frame), alone);
  }

  /// Requests in flight to server `peer` (answers not yet in).
  std::size_t in_flight(int peer) {
    std::lock_guard lk(m_);
    return pending_.in_flight(peer);
  }

  /// Runs fn on the io thread after `delay` (a timer per call).
  void run_after(std::chrono::microseconds delay, std::function<void()> fn) {
    auto t = std::make_shared<transport::asio::steady_timer>(io_, delay);
    t->async_wait([t, fn = std::move(fn)](boost::system::error_code ec) {
      if (!ec) fn();
    });
  }

  /// Sends and waits (for blocking calls: init, barrier, commands). Throws the request's error.
  void call(int peer, std::vector<transport::out_frame> frames, request r) {
    auto st = make_pooled<op_state>(1);
    r.done = st;
    send(peer, std::move(frames), std::move(r));
    op(st).wait();
  }

  /// Says goodbye to the servers and the scheduler (best effort, short deadline).
  void leave_job() {
    leaving_ = true;  // servers close once every worker left: not worth a warning
    auto bye = [&](int peer) {
      transport::out_frame f;
      f.h = wire::plain(wire::cmd::bye);
      request r;
      r.what = {call_kind::bye};
      r.timeout = std::chrono::milliseconds(5000);
      try {
        call(peer, single(std::move(f)), std::move(r));
      } catch (const std::exception&) {
      }
    };
    for (int s = 0; s < num_servers(); ++s) bye(s);
    bye(to_scheduler);
  }

  static std::vector<transport::out_frame> single(transport::out_frame f) {
    std::vector<transport::out_frame> v;
    v.push_back(std::move(f));
    return v;
  }

  /// Peers the scheduler or this worker knows to be dead or unreachable, for messages.
  std::string known_down() {
    std::lock_guard lk(m_);
    std::string s;
    for (auto& d : dead_) s += (s.empty() ? "" : ", ") + node_name(d);
    return s;
  }

 private:
  struct server_ref {
    int rank = 0, id = 0;
    std::string host;
    std::uint16_t port = 0;
    std::shared_ptr<transport::connection> conn;
    std::string down;      // non-empty once lost for good: why
    bool waiting = false;  // lost, waiting up to server_restart_wait for it to come back
    clock::time_point lost_at{};
    std::string lost_why;
  };

  // How a connection's hello went: queued (ok), or the connection closed first, and why.
  struct hello_outcome {
    bool ok = false;
    std::string why;         // the close's reason when not ok
    bool link_lost = false;  // closed by the link, not by a refusal (connection::link_lost)
  };

  // Opens the connection to server `s` (already connected socket); `then` runs on the io thread
  // once the hello is queued or the connection closed first. While `joining`, a connection that
  // closes before its hello is no lost server: join() reports it or tries again.
  void attach(server_ref& s, transport::tcp::socket sock, std::function<void(hello_outcome)> then,
              bool joining = false) {
    auto c = std::make_shared<transport::connection>(
        std::move(sock), *this, data_limits(), worker_security(role::server), opts_.chunk_bytes);
    c->peer_id = s.id;
    c->peer_rank = s.rank;
    c->peer_role = static_cast<int>(role::server);
    {
      std::lock_guard lk(m_);
      s.conn = c;
      // The hello waits for the handshake (on_authenticated), or fails with the connection.
      hellos_[c.get()] = {c, s.id, std::move(then), joining};
    }
    c->start();
  }

  // The hello proves this worker's rank for this connection (transport/identity.hpp), so it is
  // made once the handshake fixed the connection's binding. No frame was queued on the
  // connection before, so the hello goes first.
  void say_hello(std::shared_ptr<transport::connection> c, int server_id,
                 std::function<void(hello_outcome)> then) {
    if (stopping_ || c->is_closed()) return then({false, "closed", c->link_lost()});
    transport::out_frame hello;
    hello.h.command = wire::cmd::hello;
    hello.h.priority = std::numeric_limits<std::int32_t>::max();  // ahead of any re-sent request
    hello.h.sender = id_;
    hello.h.aux = static_cast<std::uint64_t>(rank_);
    hello.meta = transport::hello_proof(credential_, c->binding(), server_id, rank_);
    c->send(std::move(hello));
    then({true, {}, false});
  }

  void join() {
    transport::tls_context(opts_.security(false));  // a bad TLS file is an error now, not later
    join_scheduler();
    transport::out_frame f;
    f.h = wire::plain(wire::cmd::reg);
    f.meta = wire::encode_registration({role::worker, opts_.rank_hint, own_.host, own_.port,
                                        opts_.num_workers, opts_.num_servers});
    request r;
    r.what = {call_kind::join};
    // A little past the scheduler's own gather deadline, so its reason (who is missing, or whose
    // job sizes differ) arrives as the answer rather than a bare timeout here.
    r.timeout = opts_.connect_timeout + std::chrono::milliseconds(2000);
    r.on_response = [this](const wire::header& h, std::span<const std::byte>) { (void)h; };
    call(to_scheduler, single(std::move(f)), std::move(r));  // completed by the address book
    for (auto& s : servers_) join_server(s);
    joined_ = true;
    transport::asio::post(io_, [this] { tick(); });
    who_ = "worker " + std::to_string(rank_);
  }

  // Connects to the scheduler and waits for the token handshake, tried again as a server's
  // (join_server): the scheduler's link can be the same slow, lossy one.
  void join_scheduler() {
    join_node(scheduler_id, opts_.scheduler_host, opts_.scheduler_port,
              [this](transport::tcp::socket sock, std::function<void(hello_outcome)> then) {
                auto c = std::make_shared<transport::connection>(
                    std::move(sock), *this, small_limits(), worker_security(role::scheduler));
                {
                  std::lock_guard lk(m_);
                  sched_ = c;
                  hellos_[c.get()] = {c, scheduler_id, std::move(then), /*joining=*/true};
                }
                c->start();
              });
  }

  // Connects to server s and queues this worker's hello on it.
  void join_server(server_ref& s) {
    join_node(s.id, s.host, s.port,
              [this, &s](transport::tcp::socket sock, std::function<void(hello_outcome)> then) {
                attach(s, std::move(sock), std::move(then), /*joining=*/true);
              });
  }

  // Connects to node `id` and has open(socket, then) start the connection on the io thread;
  // then() reports how its handshake ended. A handshake that the link cut short is tried again
  // on a new connection until connect_timeout: on a slow, lossy link it can outlast
  // handshake_timeout (two lost SYNs alone take 3 s). A refusal is final.
  template <class Open>
  void join_node(int id, const std::string& host, std::uint16_t port, Open open) {
    const auto deadline = clock::now() + opts_.connect_timeout;
    std::string lost;  // how the last attempt's handshake ended, once one did
    for (int attempt = 1;; ++attempt) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      std::optional<transport::tcp::socket> sock;
      try {
        sock.emplace(transport::connect_with_retry(
            io_, host, port, std::max(left, std::chrono::milliseconds(1)),
            id == scheduler_id ? "the scheduler" : node_name(id)));
      } catch (const error& e) {
        if (lost.empty()) throw;
        throw error(errc::unreachable, "join: " + lost + "; connecting again: " + e.what());
      }
      std::promise<hello_outcome> said;
      auto outcome = said.get_future();
      transport::asio::post(io_, [&] {
        try {
          open(std::move(*sock), [&said](hello_outcome o) { said.set_value(std::move(o)); });
        } catch (...) {
          said.set_exception(std::current_exception());
        }
      });
      const hello_outcome o = outcome.get();
      if (o.ok) return;
      lost = "the connection to " + node_name(id) + " at " + host + ":" + std::to_string(port) +
             " closed during its handshake (" + o.why + ")";
      if (!o.link_lost || clock::now() >= deadline)
        throw error(errc::unreachable, "join: " + lost +
                                           (attempt > 1 ? ", attempt " + std::to_string(attempt) +
                                                              " within connect_timeout"
                                                        : ""));
      detail::log_warn("worker",
                       lost + "; connecting again (attempt " + std::to_string(attempt + 1) + ")");
    }
  }

  // A worker's connection to a node of role `peer`, which must prove that role.
  transport_security worker_security(role peer) const {
    auto sec = opts_.security(false, peer);
    sec.self = role::worker;
    return sec;
  }
  wire::limits small_limits() const {
    wire::limits l;
    l.max_payload = 1 << 20;
    l.max_meta = 16 << 20;
    return l;
  }
  wire::limits data_limits() const {
    wire::limits l;
    l.max_payload = opts_.max_frame_bytes;
    return l;
  }

  // Heartbeats and deadlines.
  void tick() {
    if (stopping_) return;
    auto now = clock::now();
    if (now >= next_heartbeat_) {
      next_heartbeat_ = now + opts_.heartbeat_interval;
      // To the scheduler (liveness) and to every server (so their idle deadline never hits a
      // worker that is only computing).
      std::vector<std::shared_ptr<transport::connection>> to;
      {
        std::lock_guard lk(m_);
        if (sched_down_.empty()) to.push_back(sched_);
        for (auto& s : servers_)
          if (s.down.empty() && s.conn && !s.waiting) to.push_back(s.conn);  // hello first
      }
      for (auto& c : to) {
        transport::out_frame f;
        f.h = wire::plain(wire::cmd::heartbeat);
        f.h.sender = id_;
        c->send(std::move(f));
      }
    }
    for (std::size_t i = 0; i < servers_.size(); ++i) {
      auto& sv = servers_[i];
      if (sv.waiting && now - sv.lost_at > opts_.server_restart_wait) {
        {
          std::lock_guard lk(m_);
          sv.waiting = false;
        }
        fail_peer(static_cast<int>(i), sv.lost_why + " and it did not come back within " +
                                           std::to_string(opts_.server_restart_wait.count()) +
                                           " ms");
      }
    }
    std::vector<request> expired;
    {
      std::lock_guard lk(m_);
      expired = pending_.take_expired(now);
    }
    for (auto& r : expired) {
      std::string who = r.peer == to_scheduler
                            ? std::string("the scheduler")
                            : node_name(servers_[static_cast<std::size_t>(r.peer)].id);
      std::string msg = r.what.str() + ": no answer from " + who + " within " +
                        std::to_string(r.timeout.count()) + " ms";
      auto d = known_down();
      if (!d.empty()) msg += " (down: " + d + ")";
      r.done->complete_part(std::make_exception_ptr(error(errc::timeout, msg)));
    }
    timer_.expires_after(std::chrono::milliseconds(50));
    timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) tick();
    });
  }

  std::span<std::byte> payload_sink(transport::connection&, const wire::header& h) override {
    if (h.command != wire::cmd::data || (h.flags & wire::flag_rows)) return {};
    std::lock_guard lk(m_);
    const request* p = pending_.find(h.req_id);
    if (!p || !p->out || !p->elem) return {};
    auto& r = *p;
    const std::uint64_t off = h.offset * r.elem;
    if (h.offset > r.out_bytes / r.elem || h.payload_len > r.out_bytes - off) return {};
    return {r.out + off, static_cast<std::size_t>(h.payload_len)};
  }

  void on_frame(transport::connection& c, const wire::header& h, std::string meta,
                std::span<const std::byte> payload) override {
    c.sync_with_direct_writes();  // an answer completes a request whose frames a caller wrote
    switch (h.command) {
      case wire::cmd::address_book:
        return on_address_book(h, meta);
      case wire::cmd::node_dead:
        return on_dead(static_cast<int>(h.key), meta);
      case wire::cmd::shutdown:
        return;
      case wire::cmd::response: {
        if ((h.flags & wire::flag_each) && h.status == 0 && h.aux > 1)
          return take_each(h.req_id, h.aux);
        auto r = take(h.req_id);
        if (!r) return;  // already failed (deadline) or an error answered earlier
        if (h.status != 0) {
          auto code = h.status <= static_cast<std::uint32_t>(errc::unsupported)
                          ? static_cast<errc>(h.status)
                          : errc::server_error;
          return r->done->complete_part(
              std::make_exception_ptr(error(code, r->what.str() + ": " + meta)));
        }
        try {
          if (r->on_text) r->on_text(meta);
          if (r->on_response) r->on_response(h, payload);
        } catch (...) {
          return r->done->complete_part(std::current_exception());
        }
        return r->done->complete_part();
      }
      case wire::cmd::data: {
        std::function<void(const wire::header&, std::span<const std::byte>)> on_data;
        bool direct = false;
        std::optional<request> bad;
        {
          std::lock_guard lk(m_);
          request* p = pending_.find(h.req_id);
          if (!p) return;
          auto& r = *p;
          on_data = r.on_data;
          direct =
              r.out && !(h.flags & wire::flag_rows) && payload.data() == r.out + h.offset * r.elem;
          if (!direct && !on_data && r.out)  // the sink refused it: it does not fit the buffer
            bad = pending_.take(h.req_id);
        }
        if (bad)  // completed without m_: a completion may run the key's next op, which sends
          return bad->done->complete_part(std::make_exception_ptr(
              error(errc::protocol, bad->what.str() + ": answer does not fit the output")));
        if (on_data) on_data(h, payload);
        if (h.flags & wire::flag_last)
          if (auto r = take(h.req_id)) r->done->complete_part();
        return;
      }
      default:
        (void)c;
        throw error(
            errc::protocol,
            "unexpected command " + std::to_string(static_cast<int>(h.command)) + " at a worker");
    }
  }

  // An ok answer to requests [first, first + n) (fused pushes, client/fusion.hpp): each one
  // still pending completes.
  void take_each(std::uint64_t first, std::uint64_t n) {
    std::vector<std::shared_ptr<op_state>> done;
    {
      std::lock_guard lk(m_);
      done = pending_.take_run(first, n);
    }
    for (auto& op : done) op->complete_part();
  }

  std::optional<request> take(std::uint64_t id) {
    std::lock_guard lk(m_);
    return pending_.take(id);
  }

  void on_address_book(const wire::header& h, const std::string& meta) {
    auto book = wire::decode_address_book(meta);  // validated: counts, ranks, hosts, ports
    if (joined_) return on_new_address_book(book);
    num_workers_ = book.num_workers;
    std::vector<server_ref> servers(book.servers.size());
    for (std::size_t i = 0; i < servers.size(); ++i) {
      servers[i].rank = book.servers[i].rank;
      servers[i].id = book.servers[i].id;
      servers[i].host = std::move(book.servers[i].host);
      servers[i].port = book.servers[i].port;
    }
    {
      std::lock_guard lk(m_);
      servers_ = std::move(servers);
      id_ = static_cast<int>(h.key);
      rank_ = static_cast<int>(h.aux);
      credential_ = std::move(book.credential);
    }
    if (auto p = take(h.req_id)) p->done->complete_part();
  }

  // A server came back (restarted with its rank): reconnect to it and re-send what it had.
  void on_new_address_book(const wire::address_book& book) {
    for (std::size_t i = 0; i < servers_.size() && i < book.servers.size(); ++i) {
      auto& s = servers_[i];
      const auto& b = book.servers[i];
      if (!s.waiting && s.host == b.host && s.port == b.port) continue;
      {
        std::lock_guard lk(m_);
        s.host = b.host;
        s.port = b.port;
      }
      if (!s.waiting) continue;  // address changed while up: the old connection's loss follows
      auto sock = std::make_shared<transport::tcp::socket>(io_);
      transport::tcp::endpoint ep;
      boost::system::error_code ec;
      auto addr = transport::asio::ip::make_address(b.host, ec);
      if (ec) {
        detail::log_warn(who_,
                         "cannot reconnect to " + node_name(s.id) + ": bad address " + b.host);
        continue;
      }
      ep = transport::tcp::endpoint(addr, b.port);
      sock->async_connect(ep, [this, i, sock](boost::system::error_code e) {
        if (e || stopping_) {
          if (e)
            detail::log_warn(
                who_, "reconnecting to " + node_name(servers_[i].id) + " failed: " + e.message());
          return;
        }
        reattach(i, std::move(*sock));
      });
    }
  }

  void reattach(std::size_t i, transport::tcp::socket sock) {
    // Requests keep waiting (s.waiting) until the hello is queued on the new connection.
    attach(servers_[i], std::move(sock), [this, i](hello_outcome o) {
      if (o.ok) resend(i);
    });
  }

  void resend(std::size_t i) {
    auto& s = servers_[i];
    std::vector<std::pair<std::uint64_t, std::vector<transport::out_frame>>> again;
    {
      std::lock_guard lk(m_);
      s.waiting = false;
      dead_.erase(s.id);
      again = pending_.frames_of(static_cast<int>(i));
    }
    for (auto& [id, frames] : again)
      for (auto& f : frames) s.conn->send(std::move(f));  // copies: the table keeps its own
    detail::log_warn(who_, node_name(s.id) + " is back: re-sent " + std::to_string(again.size()) +
                               " request(s)");
  }

  void on_dead(int id, const std::string& why) {
    {
      std::lock_guard lk(m_);
      dead_.insert(id);
    }
    // The scheduler stopped hearing from it: what waits on it fails now (its connection may
    // still be open: a paused server that resumes serves new requests again).
    for (std::size_t s = 0; s < servers_.size(); ++s)
      if (servers_[s].id == id && opts_.server_restart_wait.count() == 0)
        fail_pending(static_cast<int>(s), node_name(id) + " is dead (" + why + ")");
    if (id == scheduler_id) fail_pending(to_scheduler, "the scheduler is dead (" + why + ")");
  }

  void fail_pending(int peer, const std::string& why) {
    std::vector<request> failed;
    {
      std::lock_guard lk(m_);
      failed = pending_.take_peer(peer);
    }
    for (auto& r : failed)
      r.done->complete_part(
          std::make_exception_ptr(error(errc::node_dead, r.what.str() + ": " + why)));
  }

  // The peer is lost for good: fail what waits on it, and everything sent to it later.
  void fail_peer(int peer, const std::string& why) {
    {
      std::lock_guard lk(m_);
      std::string& down =
          peer == to_scheduler ? sched_down_ : servers_[static_cast<std::size_t>(peer)].down;
      if (down.empty()) down = why;
    }
    fail_pending(peer, why);
  }

  void on_authenticated(transport::connection& c) override {
    auto h = take_hello(c);
    if (!h) return;
    if (h->server_id == scheduler_id) return h->then({true, {}, false});  // no hello: join's reg
    say_hello(std::move(h->conn), h->server_id, std::move(h->then));
  }

  // The hello waiting for connection `c`'s handshake, if any (taken: it runs once).
  struct waiting_hello {
    std::shared_ptr<transport::connection> conn;
    int server_id = -1;
    std::function<void(hello_outcome)> then;
    bool joining = false;  // join() waits on it (attach)
  };
  std::optional<waiting_hello> take_hello(transport::connection& c) {
    std::lock_guard lk(m_);
    auto it = hellos_.find(&c);
    if (it == hellos_.end()) return std::nullopt;
    waiting_hello h = std::move(it->second);
    hellos_.erase(it);
    return h;
  }

  void on_close(transport::connection& c, const std::string& reason) override {
    if (auto h = take_hello(c)) {  // closed before its handshake finished
      const bool joining = h->joining;
      h->then({false, reason, c.link_lost()});
      if (joining) return;  // join() reports it, or connects again
    }
    if (stopping_ || leaving_) return;
    if (&c == sched_.get()) {
      {
        std::lock_guard lk(m_);
        dead_.insert(scheduler_id);
      }
      detail::log_warn(who_, "lost the scheduler: " + reason);
      return fail_peer(to_scheduler, "connection to the scheduler lost (" + reason + ")");
    }
    for (std::size_t s = 0; s < servers_.size(); ++s)
      if (servers_[s].conn.get() == &c) {
        auto& sv = servers_[s];
        const std::string why = "connection to " + node_name(sv.id) + " at " + sv.host + ":" +
                                std::to_string(sv.port) + " lost (" + reason + ")";
        {
          std::lock_guard lk(m_);
          dead_.insert(sv.id);
          if (opts_.server_restart_wait.count() > 0) {
            sv.waiting = true;
            sv.lost_at = clock::now();
            sv.lost_why = why;
          }
        }
        if (opts_.server_restart_wait.count() > 0) {
          detail::log_warn(who_, why + "; waiting up to " +
                                     std::to_string(opts_.server_restart_wait.count()) +
                                     " ms for it to come back");
          return;
        }
        detail::log_warn(who_, "lost " + node_name(sv.id) + ": " + reason);
        fail_peer(static_cast<int>(s), why);
      }
  }

  void stop_io() {
    if (!thread_.joinable()) return;
    transport::asio::post(io_, [this] {
      stopping_ = true;
      timer_.cancel();
      if (sched_) sched_->close("worker leaving");
      for (auto& s : servers_)
        if (s.conn) s.conn->close("worker leaving");
    });
    work_.reset();
    // Give the closes a moment, then stop the loop.
    transport::asio::post(io_, [this] { io_.stop(); });
    thread_.join();
    // Anything still pending fails rather than hangs.
    std::vector<request> left;
    {
      std::lock_guard lk(m_);
      left = pending_.take_all();
    }
    for (auto& r : left)
      r.done->complete_part(std::make_exception_ptr(
          error(errc::shutdown, r.what.str() + ": the store is shutting down")));
  }

  dist_options opts_;
  own_server own_;  // colocated: this process's server, registered with the worker
  transport::asio::io_context io_;
  transport::asio::steady_timer timer_;
  transport::asio::executor_work_guard<transport::asio::io_context::executor_type> work_;
  std::thread thread_;
  // The callers' threads send and the io thread takes the answers: held briefly by both.
  spin_mutex m_;
  std::shared_ptr<transport::connection> sched_;
  std::string sched_down_;
  std::vector<server_ref> servers_;
  request_table pending_;  // under m_
  std::shared_ptr<send_hook> before_send_;
  std::set<int> dead_;
  int rank_ = -1, id_ = -1, num_workers_ = 0;
  std::string credential_;  // from the address book: proves this worker's rank to servers
  std::unordered_map<const transport::connection*, waiting_hello> hellos_;  // under m_
  std::string who_ = "worker";
  clock::time_point next_heartbeat_{};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> leaving_{false};
  bool joined_ = false;  // the first address book arrived and the servers were reached
};

}  // namespace kvstore::detail
