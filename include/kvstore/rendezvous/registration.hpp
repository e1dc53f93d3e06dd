// The scheduler's registration (rendezvous/scheduler.hpp derives from it): the nodes that
// registered and their checks against the job's sizes, ranks handed out once the job gathered,
// each node's address book, a restarted server taking its dead rank's place, a job that fails.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/options.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/identity.hpp>
#include <kvstore/transport/node_base.hpp>
#include <kvstore/wire/messages.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// The base of the scheduler: the job's nodes from registration to the address book.
class scheduler_registry : public transport::node_base {
 protected:
  using clock = std::chrono::steady_clock;

  /// Binds the listening socket (transport/node_base.hpp) with the scheduler's rules.
  explicit scheduler_registry(dist_options o)
      : node_base(
            "scheduler", accept_rules_of(o), host_of(o), o.scheduler_port, true,
            "scheduler cannot listen on " + host_of(o) + ":" + std::to_string(o.scheduler_port)),
        opts_(std::move(o)) {}

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

  node* by_id(int id) {
    for (auto& n : nodes_)
      if (n.id == id) return &n;
    return nullptr;
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
      // Refused alone: the job goes on gathering (or running) without the misconfigured node;
      // if it then does not gather in time, its error names the last refusal.
      reply(self, h.req_id, errc::invalid_argument, bad);
      detail::log_warn("scheduler", "refused a node: " + bad);
      if (!gathered_) last_refusal_ = bad;
      self->close("wrong job size");
      return;
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

  void finish() { finish_once(); }

  dist_options opts_;
  std::set<std::shared_ptr<transport::connection>> pending_;  // not registered yet
  std::vector<node> nodes_;
  std::map<transport::connection*, std::uint64_t> reg_req_;
  bool gathered_ = false;
  std::string failure_;
  errc failure_code_ = errc::timeout;
  std::string last_refusal_;  // the last node refused before the job gathered, for its deadline
  std::string secret_;        // the job secret (transport/identity.hpp), drawn at gather
};

}  // namespace kvstore::detail
