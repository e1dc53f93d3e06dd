// What a server and the scheduler share: one io thread, a listening socket bound to the chosen
// host, an accept loop bounded by max_connections, a timer for heartbeats, answers to requests,
// and the way a node finishes (acceptor closed, connections closed, io stopped). Each node adds
// its own frames, membership and ticks on top.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/security.hpp>
#include <kvstore/wire/frame.hpp>

#include <cstdint>
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
    transport_security security;
    wire::limits limits;
    std::size_t gather_bytes = std::size_t{1} << 20;
  };

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

 protected:
  /// Binds host:port at once; `what` names the node in the error ("server cannot listen on
  /// 1.2.3.4"). Throws kvstore::error(unreachable) when it cannot; a bad TLS file is an error
  /// now, not later.
  node_base(std::string who, accept_rules rules, const std::string& host, std::uint16_t port,
            bool reuse_address, const std::string& what)
      : acceptor_(io_), timer_(io_), who_(std::move(who)), rules_(std::move(rules)) {
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

  /// Connections this node holds now (counted against max_connections).
  virtual std::size_t connections() const = 0;
  /// A new connection, not started yet: keep it, then it is started.
  virtual void accepted(conn_ptr c) = 0;
  /// Closes every connection this node holds (finish()).
  virtual void close_all() = 0;

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;  // acceptor closed
      if (connections() >= rules_.max_connections) {
        detail::log_warn(who_, "refused a connection: already " + std::to_string(connections()) +
                                   " (max_connections)");
        boost::system::error_code ig;
        s.close(ig);
        return accept();
      }
      auto c = std::make_shared<connection>(std::move(s), *this, rules_.limits, rules_.security,
                                            rules_.gather_bytes);
      accepted(c);
      c->start();
      accept();
    });
  }

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
    boost::system::error_code ec;
    acceptor_.close(ec);
    timer_.cancel();
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
};

}  // namespace kvstore::transport
