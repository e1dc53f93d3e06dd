// The scheduler: gathers the job (every server and worker registers), hands out node ids, ranks
// and the servers' addresses, runs barriers, tracks liveness by heartbeats and closed
// connections, tells everyone when a node dies, and ends the job when every worker has left.
// Registration, ranks and the address book are its base (rendezvous/registration.hpp); this
// file is the frames after it: barriers, heartbeats and dead nodes, the end of the job.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/node.hpp>
#include <kvstore/options.hpp>
#include <kvstore/rendezvous/registration.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/identity.hpp>
#include <kvstore/transport/node_base.hpp>
#include <kvstore/wire/messages.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace kvstore {

class scheduler final : public detail::scheduler_registry {
 public:
  /// Binds the listening socket at once (port 0 picks a free port; see port()).
  /// Throws kvstore::error(unreachable) when the address cannot be bound.
  explicit scheduler(dist_options o) : scheduler_registry(std::move(o)) {
    id_ = detail::scheduler_id;
    const std::string host = host_of(opts_);
    if (opts_.token.empty() && host != "127.0.0.1")
      detail::log_warn("scheduler", "no KVSTORE_TOKEN set but listening on " + host +
                                        ": anyone who reaches the port can join");
    else if (opts_.token.empty())
      detail::log_info("scheduler", "no token: listening on loopback only");
  }

  using node_base::port;

  /// Serves until the job is over (every worker said bye or died, servers told to shut down).
  /// Throws kvstore::error when the job does not gather within connect_timeout (timeout), or a
  /// node registers with other job sizes than the scheduler's (invalid_argument).
  void run() {
    start_ = clock::now();
    accept();
    tick();
    io_.run();
    if (!failure_.empty()) throw error(failure_code_, failure_);
  }

  /// Stops serving (from any thread).
  void stop() {
    transport::asio::post(io_, [this] { finish(); });
  }

 private:
  std::size_t connections() const override { return pending_.size() + nodes_.size(); }
  void accepted(conn_ptr c) override { pending_.insert(std::move(c)); }
  void close_all() override {
    for (auto& n : nodes_)
      if (n.conn) n.conn->close("job over");
    for (auto& c : pending_) c->close("job over");
  }

  void tick() {
    timer_.expires_after(std::min<std::chrono::milliseconds>(opts_.heartbeat_interval,
                                                             std::chrono::milliseconds(250)));
    timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || done_) return;
      auto now = clock::now();
      if (!gathered_ && failure_.empty() && now - start_ > opts_.connect_timeout)
        return fail_job(
            errc::timeout,
            "the job did not gather within " + std::to_string(opts_.connect_timeout.count()) +
                " ms: " + std::to_string(count(role::server)) + " of " +
                std::to_string(opts_.num_servers) + " servers and " +
                std::to_string(count(role::worker)) + " of " + std::to_string(opts_.num_workers) +
                " workers registered" +
                (last_refusal_.empty() ? std::string() : "; refused: " + last_refusal_));
      if (gathered_) {
        for (auto& n : nodes_) {
          if (!n.dead && !n.bye && now - n.last_heard > opts_.dead_timeout)
            mark_dead(n,
                      "not heard from for " + std::to_string(opts_.dead_timeout.count()) + " ms");
        }
      }
      tick();
    });
  }

  void on_frame(transport::connection& c, const wire::header& h, std::string meta,
                std::span<const std::byte>) override {
    node* n = find(c);
    if (!n) {
      if (h.command != wire::cmd::reg) throw error(errc::protocol, "first frame must register");
      return on_register(c, h, meta);
    }
    n->last_heard = clock::now();
    if (n->dead && !n->left) {
      n->dead = false;
      detail::log_warn("scheduler", detail::node_name(n->id) + " is heard from again");
    }
    switch (h.command) {
      case wire::cmd::heartbeat:
        return;
      case wire::cmd::barrier:
        if (n->r != role::worker) throw error(errc::protocol, "barrier from a non-worker");
        // A barrier counts workers, not frames: a second one from a worker already waiting
        // would release the others early (and grow the list without bound).
        for (auto& [id, req] : barrier_)
          if (id == n->id)
            return reply(n->conn, h.req_id, errc::invalid_argument,
                         "barrier: " + detail::node_name(n->id) +
                             " is already waiting at this barrier (one barrier per worker at a "
                             "time)");
        barrier_.emplace_back(n->id, h.req_id);
        return check_barrier();
      case wire::cmd::dead_count: {
        auto timeout = std::chrono::milliseconds(h.total);
        auto now = clock::now();
        std::uint64_t dead = 0;
        for (auto& m : nodes_) {
          if (!(static_cast<std::uint64_t>(detail::group_of(m.r)) & h.key)) continue;
          if (m.bye) continue;
          if (m.dead || now - m.last_heard > timeout) ++dead;
        }
        return reply(n->conn, h.req_id, errc::ok, {}, dead);
      }
      case wire::cmd::leave:
        n->left = true;
        reply(n->conn, h.req_id, errc::ok, {});
        broadcast_left(*n);
        return check_barrier();
      case wire::cmd::bye:
        n->bye = true;
        n->left = true;
        detail::log_info("scheduler", detail::node_name(n->id) + " said bye");
        reply(n->conn, h.req_id, errc::ok, {});
        check_barrier();
        return check_end();
      default:
        throw error(errc::protocol, "unexpected command " +
                                        std::to_string(static_cast<int>(h.command)) +
                                        " at the scheduler");
    }
  }

  void check_barrier() {
    if (barrier_.empty()) return;
    std::string dead;
    int live = 0;
    for (auto& n : nodes_) {
      if (n.r != role::worker || n.left) continue;
      if (n.dead)
        dead += (dead.empty() ? "" : ", ") + detail::node_name(n.id);
      else
        ++live;
    }
    if (!dead.empty()) {
      for (auto& [id, req] : barrier_)
        if (auto* n = by_id(id))
          reply(n->conn, req, errc::node_dead, "barrier cannot complete: " + dead + " died");
      barrier_.clear();
      return;
    }
    int waiting = 0;
    for (auto& [id, req] : barrier_)
      if (auto* n = by_id(id); n && !n->left) ++waiting;
    if (waiting < live) return;
    for (auto& [id, req] : barrier_)
      if (auto* n = by_id(id)) reply(n->conn, req, errc::ok, {});
    barrier_.clear();
  }

  void mark_dead(node& n, const std::string& why) {
    if (n.dead || n.bye) return;
    n.dead = true;
    const bool leaves = n.r == role::worker && opts_.on_worker_death == worker_death::leave_group;
    if (leaves) n.left = true;  // barriers go on without it
    detail::log_warn("scheduler", detail::node_name(n.id) + " is dead: " + why +
                                      (leaves ? "; it leaves the sync group" : ""));
    for (auto& m : nodes_) {
      if (&m == &n || m.dead || !m.conn) continue;
      transport::out_frame f;
      f.h.command = wire::cmd::node_dead;
      f.h.key = static_cast<std::uint64_t>(n.id);
      f.h.sender = detail::scheduler_id;
      f.meta = why;
      m.conn->send(std::move(f));
    }
    check_barrier();
    check_end();
  }

  void broadcast_left(const node& n) {
    for (auto& m : nodes_) {
      if (m.r != role::server || m.dead || !m.conn) continue;
      transport::out_frame f;
      f.h.command = wire::cmd::leave;
      f.h.key = static_cast<std::uint64_t>(n.id);
      f.h.aux = static_cast<std::uint64_t>(n.rank);
      f.h.sender = detail::scheduler_id;
      m.conn->send(std::move(f));
    }
  }

  // The job ends when no worker is left running.
  void check_end() {
    if (!gathered_ || ending_) return;
    for (auto& n : nodes_)
      if (n.r == role::worker && !n.bye && !n.dead) return;
    ending_ = true;
    detail::log_info("scheduler", "every worker is gone: shutting the servers down");
    for (auto& n : nodes_) {
      if (n.r != role::server || n.dead || !n.conn) continue;
      transport::out_frame f;
      f.h.command = wire::cmd::shutdown;
      f.h.sender = detail::scheduler_id;
      n.conn->send(std::move(f));
    }
    // Give the frames a moment to leave, then stop.
    timer_.expires_after(std::chrono::milliseconds(200));
    timer_.async_wait([this](boost::system::error_code) { finish(); });
  }

  void closed(transport::connection& c, const std::string& reason) override {
    for (auto it = pending_.begin(); it != pending_.end(); ++it)
      if (it->get() == &c) {
        if (reason != "job over")
          detail::log_warn("scheduler", "dropped connection from " + c.remote() + ": " + reason);
        pending_.erase(it);
        return;
      }
    node* n = find(c);
    if (!n || done_) return;
    if (!gathered_) {
      // A node that leaves before the job gathered simply is not part of it.
      detail::log_warn("scheduler", std::string("a ") + detail::role_name(n->r) +
                                        " left before the job gathered: " + reason);
      for (auto it = nodes_.begin(); it != nodes_.end(); ++it)
        if (&*it == n) {
          nodes_.erase(it);
          break;
        }
      return;
    }
    if (!n->bye && !ending_) mark_dead(*n, "connection lost (" + reason + ")");
  }

  std::vector<std::pair<int, std::uint64_t>> barrier_;
  clock::time_point start_;
  bool ending_ = false;
};

}  // namespace kvstore
