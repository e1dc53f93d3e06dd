// What a server and the scheduler share: one io thread, a listening socket bound to the chosen
// host, an accept loop that survives every accept error, a timer for heartbeats, answers to
// requests, and the way a node finishes (acceptor closed, connections closed, io stopped). Each
// node adds its own frames, membership and ticks on top.
//
// Connections that have not proven the token yet live here, in a small pool of their own
// (max_pending_connections, a tiny read buffer, the handshake deadline); a full pool evicts its
// oldest. Only a proven connection is handed to the node (accepted()) and counts against
// max_connections. Both pools fit in the process's descriptor limit (raised to its hard limit at
// start), so a flood of unauthenticated sockets never keeps a real peer out.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/inproc.hpp>
#include <kvstore/transport/security.hpp>
#include <kvstore/transport/tcp_congestion.hpp>
#include <kvstore/transport/tcp_connection.hpp>
#include <kvstore/wire/frame.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>

namespace kvstore::transport {

/// The host a node listens on: the configured one, else loopback without a token (nobody else
/// can join then) and every interface with one.
inline std::string bind_host(const std::string& configured, const std::string& token) {
  if (!configured.empty()) return configured;
  return token.empty() ? std::string("127.0.0.1") : std::string("0.0.0.0");
}

class node_base : public frame_handler {
 public:
  using conn_ptr = std::shared_ptr<connection>;

  /// What the node accepts: how many connections at most, how they authenticate, what a frame
  /// may carry, and how many bytes a write gathers.
  struct accept_rules {
    std::size_t max_connections = 4096;
    std::size_t max_pending_connections = 64;
    transport_security security;
    wire::limits limits;
    std::size_t gather_bytes = std::size_t{1} << 20;
  };

  std::uint16_t port() const {
    return inproc_port_ ? inproc_port_ : acceptor_.local_endpoint().port();
  }

  /// The caps in force: the configured ones, lowered to fit the descriptor limit.
  std::size_t max_connections() const noexcept { return rules_.max_connections; }
  std::size_t max_pending_connections() const noexcept { return rules_.max_pending_connections; }
  /// Accept errors survived so far (EMFILE and the like); any thread may ask.
  std::uint64_t accept_errors() const noexcept { return accept_errors_.load(); }

 protected:
  /// Binds host:port at once; `what` names the node in the error ("server cannot listen on
  /// 1.2.3.4"). Throws kvstore::error(unreachable) when it cannot; a bad TLS file is an error
  /// now, not later.
  node_base(std::string who, accept_rules rules, const std::string& host, std::uint16_t port,
            bool reuse_address, const std::string& what)
      : acceptor_(io_),
        timer_(io_),
        who_(std::move(who)),
        rules_(std::move(rules)),
        accept_retry_(io_) {
    fit_to_descriptors(rules_, who_);
    if (is_inproc(host)) {
      listen_inproc(port);
      return;
    }
    check_congestion(rules_.security.tcp_congestion);  // a name the kernel refuses fails here
    try {
      tcp::endpoint ep(asio::ip::make_address(host), port);
      acceptor_.open(ep.protocol());
      if (reuse_address) acceptor_.set_option(tcp::acceptor::reuse_address(true));
      acceptor_.bind(ep);
      acceptor_.listen();
    } catch (const std::exception& e) {
      throw error(errc::unreachable, what + ": " + e.what());
    }
    tls_context(rules_.security);
  }

  // Once it returns, no new in-process end reaches this node (its executor's handlers die with
  // it).
  ~node_base() override {
    if (inproc_port_) inproc_network::get().unlisten(inproc_port_, this);
  }

  /// Proven connections this node holds now (counted against max_connections).
  virtual std::size_t connections() const = 0;
  /// A connection whose peer proved the token: keep it (its frames follow).
  virtual void accepted(conn_ptr c) = 0;
  /// A connection this node kept (accepted(), or one it opened) closed; called once.
  virtual void closed(connection& c, const std::string& reason) = 0;
  /// Closes every connection this node holds (finish()).
  virtual void close_all() = 0;

  /// Descriptors a node keeps for itself beyond its connections: the listening socket, the
  /// scheduler's connection, files (snapshots, logs) and the runtime's own (epoll, timers).
  static constexpr std::size_t reserved_descriptors = 32;

  /// Lowers the connection caps so both pools fit in the descriptor limit (the soft
  /// RLIMIT_NOFILE is raised to the hard one first): the pending pool takes at most a quarter of
  /// what is left after the reserve, proven connections the rest. Then a flood of unproven
  /// sockets is evicted from its own pool before the descriptors run out, and a proven peer
  /// always finds a descriptor. Logged when a cap was lowered.
  static void fit_to_descriptors(accept_rules& r, const std::string& who) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur < rl.rlim_max) {
      rlimit up = rl;
      up.rlim_cur = rl.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    if (rl.rlim_cur == RLIM_INFINITY) return;
    const auto fds = static_cast<std::size_t>(rl.rlim_cur);
    const std::size_t room = fds > reserved_descriptors + 2 ? fds - reserved_descriptors : 2;
    const std::size_t pending =
        std::min(r.max_pending_connections, std::max<std::size_t>(1, room / 4));
    const std::size_t proven =
        std::min(r.max_connections, std::max<std::size_t>(1, room - pending));
    if (pending < r.max_pending_connections || proven < r.max_connections)
      detail::log_warn(
          who, "descriptor limit " + std::to_string(fds) + ": at most " + std::to_string(proven) +
                   " connections and " + std::to_string(pending) +
                   " unauthenticated ones (max_connections " + std::to_string(r.max_connections) +
                   ", max_pending_connections " + std::to_string(r.max_pending_connections) + ")");
    r.max_pending_connections = pending;
    r.max_connections = proven;
  }

  // Listens on this process's in-process network (host "inproc"): a dialed end is adopted on
  // the io thread, as an accepted socket would be.
  void listen_inproc(std::uint16_t port) {
    inproc_connection::end me{io_.get_executor(), this, rules_.security, rules_.limits};
    inproc_port_ = inproc_network::get().listen(
        port,
        {me, [this](std::shared_ptr<connection> c) { asio::post(io_, [this, c] { adopt(c); }); },
         this});
  }

  // An in-process end: proven once started, so on_authenticated() checks max_connections.
  void adopt(conn_ptr c) {
    unproven_.push_back(c);
    if (done_)
      c->close("shutting down");
    else
      c->start();
  }

  void accept() {
    if (inproc_port_) return;  // the in-process network hands ends to adopt()
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (done_ || !acceptor_.is_open()) return;
      if (ec) return accept_failed(ec);
      accept_trouble_ = false;
      if (connections() >= rules_.max_connections) {
        // Checked again once it is proven; a socket we cannot serve is closed now.
        detail::log_warn(who_, "refused a connection: already " + std::to_string(connections()) +
                                   " (max_connections)");
        boost::system::error_code ig;
        s.close(ig);
        return accept();
      }
      if (unproven_.size() >= rules_.max_pending_connections) {
        // The oldest unproven connection makes room: a flood cannot hold the door shut for
        // longer than the time a real peer needs to prove itself.
        auto oldest = unproven_.front();
        unproven_.pop_front();
        evicted_.push_back(oldest);
        oldest->close("evicted: too many unauthenticated connections");
        const auto now = std::chrono::steady_clock::now();
        if (now - last_eviction_log_ > std::chrono::seconds(10)) {
          last_eviction_log_ = now;
          detail::log_warn(who_, "more than " + std::to_string(rules_.max_pending_connections) +
                                     " connections have not proven the token: evicting the "
                                     "oldest (max_pending_connections)");
        }
      }
      auto c = std::make_shared<tcp_connection>(std::move(s), *this, rules_.limits, rules_.security,
                                                rules_.gather_bytes);
      unproven_.push_back(c);
      c->start();
      accept();
    });
  }

  // An accept error (out of descriptors, of memory, a connection reset before it was taken):
  // retry after a pause instead of giving up listening for good; logged once per episode.
  void accept_failed(const boost::system::error_code& ec) {
    if (!accept_trouble_)
      detail::log_warn(who_, "accept failed (" + ec.message() + "); retrying every 100 ms");
    accept_trouble_ = true;
    ++accept_errors_;
    accept_retry_.expires_after(std::chrono::milliseconds(100));
    accept_retry_.async_wait([this](boost::system::error_code e) {
      if (!e && !done_) accept();
    });
  }

  void on_authenticated(connection& c) override {
    for (auto it = unproven_.begin(); it != unproven_.end(); ++it)
      if (it->get() == &c) {
        auto self = *it;
        unproven_.erase(it);
        if (connections() >= rules_.max_connections) {
          detail::log_warn(who_, "refused " + c.remote() + ": already " +
                                     std::to_string(connections()) + " (max_connections)");
          c.close("too many connections (max_connections)");
          return;
        }
        return accepted(std::move(self));
      }
  }

  void on_close(connection& c, const std::string& reason) override {
    for (auto it = evicted_.begin(); it != evicted_.end(); ++it)
      if (it->get() == &c) {
        evicted_.erase(it);
        return;
      }
    for (auto it = unproven_.begin(); it != unproven_.end(); ++it)
      if (it->get() == &c) {
        unproven_.erase(it);
        if (!done_)
          detail::log_info(who_,
                           "dropped " + c.remote() + " before it proved the token: " + reason);
        return;
      }
    closed(c, reason);
  }

  /// Unproven connections now (the pending pool).
  std::size_t unproven_connections() const noexcept { return unproven_.size(); }

  /// Answers request `req` of `c` (aux: the answer's number, if any).
  void reply(connection& c, std::uint64_t req, errc status, std::string msg,
             std::uint64_t aux = 0) {
    out_frame f;
    f.h.command = wire::cmd::response;
    f.h.req_id = req;
    f.h.status = static_cast<std::uint32_t>(status);
    f.h.sender = id_;
    f.h.aux = aux;
    f.meta = std::move(msg);
    c.send(std::move(f));
  }
  void reply(const conn_ptr& c, std::uint64_t req, errc status, std::string msg,
             std::uint64_t aux = 0) {
    if (c) reply(*c, req, status, std::move(msg), aux);
  }

  /// Ends serving once: stops accepting and ticking, closes every connection, then stops the io
  /// loop (after the closes ran), so run() returns. False if it had finished before.
  bool finish_once() {
    if (done_) return false;
    done_ = true;
    if (inproc_port_) inproc_network::get().unlisten(inproc_port_, this);
    boost::system::error_code ec;
    acceptor_.close(ec);
    timer_.cancel();
    accept_retry_.cancel();
    for (auto& c : unproven_) c->close("shutting down");
    for (auto& c : evicted_) c->close("shutting down");
    close_all();
    asio::post(io_, [this] { io_.stop(); });
    return true;
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer timer_;
  std::string who_;  ///< the node's name in logs and errors
  int id_ = -1;      ///< the node id answers carry as their sender
  bool done_ = false;

 private:
  accept_rules rules_;
  asio::steady_timer accept_retry_;
  std::list<conn_ptr> unproven_;  // accepted sockets that have not proven the token, oldest first
  std::list<conn_ptr> evicted_;   // closed to make room, until their close has run
  std::chrono::steady_clock::time_point last_eviction_log_{};
  bool accept_trouble_ = false;
  std::atomic<std::uint64_t> accept_errors_{0};
  std::uint16_t inproc_port_ = 0;  // listening on the in-process network, not on TCP
};

}  // namespace kvstore::transport
