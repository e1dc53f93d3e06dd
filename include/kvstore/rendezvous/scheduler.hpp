// The scheduler: gathers the job (every server and worker registers), hands out node ids, ranks
// and the servers' addresses, runs barriers, tracks liveness by heartbeats and closed
// connections, tells everyone when a node dies, and ends the job when every worker has left.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/node.hpp>
#include <kvstore/options.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/identity.hpp>
#include <kvstore/transport/node_base.hpp>
#include <kvstore/wire/messages.hpp>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace kvstore {

class scheduler final : public transport::node_base {
  using clock = std::chrono::steady_clock;

 public:
  /// Binds the listening socket at once (port 0 picks a free port; see port()).
  /// Throws kvstore::error(unreachable) when the address cannot be bound.
  explicit scheduler(dist_options o)
      : node_base(
            "scheduler", accept_rules_of(o), host_of(o), o.scheduler_port, true,
            "scheduler cannot listen on " + host_of(o) + ":" + std::to_string(o.scheduler_port)),
        opts_(std::move(o)) {
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
  static std::string host_of(const dist_options& o) {
    std::string host = transport::bind_host(o.bind_host, o.token);
    if (o.bind_host.empty() && o.token.empty() && o.scheduler_host != "127.0.0.1" &&
        o.scheduler_host != "localhost")
      host = "0.0.0.0";  // a cluster's scheduler must be reachable; without a token we warn
    return host;
  }
  static accept_rules accept_rules_of(const dist_options& o) {
    accept_rules r;
    r.max_connections = o.max_connections;
    r.max_pending_connections = o.max_pending_connections;
    r.security = o.security(true);
    r.security.self = role::scheduler;
    r.limits.max_payload = 1 << 20;  // the scheduler takes no tensors
    r.limits.max_meta = 1 << 20;
    return r;
  }

  struct node {
    int id = -1;
    int rank = -1;
    role r = role::worker;
    std::string host;
    std::uint16_t port = 0;
    std::shared_ptr<transport::connection> conn;
    clock::time_point last_heard;
    bool dead = false;
    bool bye = false;
    bool left = false;
  };

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
        return fail_job(errc::timeout, "the job did not gather within " +
                                           std::to_string(opts_.connect_timeout.count()) +
                                           " ms: " + std::to_string(count(role::server)) + " of " +
                                           std::to_string(opts_.num_servers) + " servers and " +
                                           std::to_string(count(role::worker)) + " of " +
                                           std::to_string(opts_.num_workers) +
                                           " workers registered");
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

  int count(role r) const {
    int c = 0;
    for (auto& n : nodes_) c += n.r == r;
    return c;
  }

  node* find(transport::connection& c) {
    for (auto& n : nodes_)
      if (n.conn.get() == &c) return &n;
    return nullptr;
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

  // The job cannot start: every node waiting for its address book gets `why` as the answer to its
  // registration, then (once the answers had a moment to leave) the scheduler stops and run()
  // throws it.
  void fail_job(errc code, const std::string& why) {
    failure_ = why;
    failure_code_ = code;
    detail::log_warn("scheduler", why);
    for (auto& n : nodes_)
      if (auto it = reg_req_.find(n.conn.get()); it != reg_req_.end())
        reply(n.conn, it->second, code, why);
    timer_.cancel();
    timer_.expires_after(std::chrono::milliseconds(200));
    timer_.async_wait([this](boost::system::error_code) { finish(); });
  }

  // What differs between a registering node's job sizes and the scheduler's ("" if nothing).
  std::string size_mismatch(const wire::registration& reg, const node& n) const {
    std::string diff;
    auto check = [&](const char* var, int theirs, int ours) {
      if (theirs == ours) return;
      diff += std::string(diff.empty() ? "" : " and ") + var + "=" + std::to_string(theirs) +
              " but the scheduler has " + std::to_string(ours);
    };
    check("KVSTORE_NUM_WORKERS", reg.num_workers, opts_.num_workers);
    check("KVSTORE_NUM_SERVERS", reg.num_servers, opts_.num_servers);
    if (diff.empty()) return diff;
    std::string who = std::string(detail::role_name(n.r)) + " at ";
    who += n.r == role::server ? n.host + ":" + std::to_string(n.port) : n.conn->remote();
    if (n.rank >= 0) who += " (rank hint " + std::to_string(n.rank) + ")";
    return who + " has " + diff;
  }

  void on_register(transport::connection& c, const wire::header& h, const std::string& meta) {
    auto reg = wire::decode_registration(meta);  // validated: role, rank hint, host, port, sizes
    node n;
    n.r = reg.r;
    n.rank = reg.rank_hint;  // hint, -1 for none
    n.host = std::move(reg.host);
    n.port = reg.port;
    if (n.host.empty()) {
      auto rem = c.remote();
      n.host = rem.substr(0, rem.rfind(':'));
    }
    n.last_heard = clock::now();
    std::shared_ptr<transport::connection> self;
    for (auto it = pending_.begin(); it != pending_.end(); ++it)
      if (it->get() == &c) {
        self = *it;
        pending_.erase(it);
        break;
      }
    n.conn = self;
    if (!failure_.empty()) {  // the job failed: this node waits for nothing
      reply(self, h.req_id, failure_code_, failure_);
      pending_.insert(self);
      return;
    }
    if (auto bad = size_mismatch(reg, n); !bad.empty()) {
      reply(self, h.req_id, errc::invalid_argument, bad);
      if (gathered_) {  // a running job goes on without the misconfigured node
        detail::log_warn("scheduler", "refused a node: " + bad);
        self->close("wrong job size");
        return;
      }
      pending_.insert(self);  // closed with the rest when the scheduler stops
      return fail_job(errc::invalid_argument, bad);
    }
    if (gathered_ && take_back(n, h.req_id)) return;
    const int want = n.r == role::server ? opts_.num_servers : opts_.num_workers;
    if (gathered_ || count(n.r) >= want) {
      reply(self, h.req_id, errc::invalid_argument,
            std::string("the job already has all its ") + detail::role_name(n.r) + "s");
      self->close("surplus node");
      return;
    }
    nodes_.push_back(std::move(n));
    reg_req_[self.get()] = h.req_id;
    if (count(role::server) == opts_.num_servers && count(role::worker) == opts_.num_workers)
      gather();
  }

  // Everyone is here: assign ranks (hints first, then arrival order) and send the address book.
  void gather() {
    gathered_ = true;
    secret_ = transport::make_job_secret();
    for (role r : {role::server, role::worker}) {
      const int total = r == role::server ? opts_.num_servers : opts_.num_workers;
      std::vector<bool> taken(static_cast<std::size_t>(total), false);
      std::vector<node*> unplaced;
      for (auto& n : nodes_) {
        if (n.r != r) continue;
        if (r == role::worker) take_own_server_rank(n);
        if (n.rank >= 0 && n.rank < total && !taken[static_cast<std::size_t>(n.rank)])
          taken[static_cast<std::size_t>(n.rank)] = true;
        else
          unplaced.push_back(&n);
      }
      int next = 0;
      for (node* n : unplaced) {
        while (taken[static_cast<std::size_t>(next)]) ++next;
        n->rank = next;
        taken[static_cast<std::size_t>(next)] = true;
      }
      for (auto& n : nodes_)
        if (n.r == r)
          n.id = r == role::server ? detail::server_id(n.rank) : detail::worker_id(n.rank);
    }
    // Servers first: a worker connects to them as soon as it has the book.
    for (role r : {role::server, role::worker})
      for (auto& n : nodes_)
        if (n.r == r) send_book(n, reg_req_[n.conn.get()]);
    detail::log_info("scheduler", "job gathered: " + std::to_string(opts_.num_servers) +
                                      " servers, " + std::to_string(opts_.num_workers) +
                                      " workers");
  }

  // A colocated worker registers the address of the server it runs (dist_options::colocated):
  // it takes that server's rank, so worker rank = server rank whatever order they came in.
  // Servers are ranked before workers.
  void take_own_server_rank(node& w) const {
    if (w.port == 0) return;
    for (auto& n : nodes_)
      if (n.r == role::server && n.port == w.port && n.host == w.host) {
        w.rank = n.rank;
        return;
      }
  }

  // Node n's address book: a server's carries the job secret (it checks every worker's hello), a
  // worker's only its own credential (it proves its rank with it).
  std::string address_book(const node& n) const {
    wire::address_book b;
    if (n.r == role::server)
      b.job_secret = secret_;
    else
      b.credential = transport::node_credential(secret_, n.id);
    b.num_workers = opts_.num_workers;
    b.servers.resize(static_cast<std::size_t>(opts_.num_servers));
    for (auto& n : nodes_)
      if (n.r == role::server)
        b.servers[static_cast<std::size_t>(n.rank)] = {n.rank, n.id, n.host, n.port};
    return wire::encode_address_book(b);
  }

  void send_book(node& n, std::uint64_t req) {
    n.conn->peer_id = n.id;
    n.conn->peer_rank = n.rank;
    n.conn->peer_role = static_cast<int>(n.r);
    transport::out_frame f;
    f.h.command = wire::cmd::address_book;
    f.h.req_id = req;
    f.h.key = static_cast<std::uint64_t>(n.id);
    f.h.aux = static_cast<std::uint64_t>(n.rank);
    f.h.sender = detail::scheduler_id;
    f.meta = address_book(n);
    n.conn->send(std::move(f));
    n.last_heard = clock::now();
  }

  // A server restarted with the identity (rank) of a dead one: it takes that place, and every
  // live worker gets the new address book so it reconnects and re-sends what was in flight.
  bool take_back(node& fresh, std::uint64_t req) {
    if (fresh.r != role::server || fresh.rank < 0) return false;
    node* old = nullptr;
    for (auto& n : nodes_)
      if (n.r == role::server && n.rank == fresh.rank) old = &n;
    if (!old || !old->dead) return false;
    old->conn = fresh.conn;
    old->host = fresh.host;
    old->port = fresh.port;
    old->dead = false;
    old->last_heard = clock::now();
    detail::log_warn("scheduler", detail::node_name(old->id) + " is back at " + old->host + ":" +
                                      std::to_string(old->port));
    send_book(*old, req);
    for (auto& n : nodes_)
      if (n.r == role::worker && !n.dead && !n.bye && n.conn) send_book(n, 0);
    return true;
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

  node* by_id(int id) {
    for (auto& n : nodes_)
      if (n.id == id) return &n;
    return nullptr;
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

  void finish() { finish_once(); }

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

  dist_options opts_;
  std::set<std::shared_ptr<transport::connection>> pending_;  // not registered yet
  std::vector<node> nodes_;
  std::map<transport::connection*, std::uint64_t> reg_req_;
  std::vector<std::pair<int, std::uint64_t>> barrier_;
  clock::time_point start_;
  bool gathered_ = false;
  bool ending_ = false;
  std::string failure_;
  errc failure_code_ = errc::timeout;
  std::string secret_;  // the job secret (transport/identity.hpp), drawn at gather
};

}  // namespace kvstore
