// A worker's links to the job's nodes and the requests in flight over them: what the stores call
// to send (send, send_each, call), the heartbeats and deadlines (tick), and failing what a lost
// peer held. It holds the whole client's state, so the joining (client/join.hpp) and the answers
// and lost servers (client/client.hpp) built on it read the same fields, one lock for all.
#pragma once

#include <kvstore/client/call.hpp>
#include <kvstore/client/colocated_roles.hpp>  // own_server
#include <kvstore/client/pending.hpp>
#include <kvstore/detail/block_pool.hpp>
#include <kvstore/detail/spin_mutex.hpp>
#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/op.hpp>
#include <kvstore/options.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/endpoint.hpp>
#include <kvstore/wire/commands.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

class worker_links : public transport::frame_handler {
 protected:
  using clock = std::chrono::steady_clock;

 public:
  static constexpr int to_scheduler = request_table::to_scheduler;

  /// One request (client/pending.hpp).
  using request = pending_request;

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

 protected:
  // The state alone: worker_client's constructor starts the io thread and joins the job.
  worker_links(dist_options o, own_server colocated)
      : opts_(std::move(o)), own_(std::move(colocated)), timer_(io_), work_(io_.get_executor()) {}

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

  // The hello waiting for connection `c`'s handshake, if any (taken: it runs once).
  struct waiting_hello {
    std::shared_ptr<transport::connection> conn;
    int server_id = -1;
    std::function<void(hello_outcome)> then;
    bool joining = false;  // join() waits on it (attach)
  };

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
