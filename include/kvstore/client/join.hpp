// Joining the job: the scheduler's connection and the address book it answers with, then a
// connection to every server, each with its handshake and the hello that proves this worker's
// rank; a handshake that a lossy link cut short is tried again until connect_timeout. A layer of
// its own: once joined only attach() runs again, for a restarted server (client/client.hpp).
#pragma once

#include <kvstore/client/call.hpp>
#include <kvstore/client/worker_links.hpp>
#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/options.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/dial.hpp>
#include <kvstore/transport/endpoint.hpp>
#include <kvstore/transport/identity.hpp>
#include <kvstore/transport/tls.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace kvstore::detail {

class worker_join : public worker_links {
 protected:
  using worker_links::worker_links;

  // Starts `c`, the connection to server `s` (dialed, not started); `then` runs on the io
  // thread once the hello is queued or the connection closed first. While `joining`, a
  // connection that closes before its hello is no lost server: join() reports it or tries again.
  void attach(server_ref& s, std::shared_ptr<transport::connection> c,
              std::function<void(hello_outcome)> then, bool joining = false) {
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
    join_node(
        scheduler_id, opts_.scheduler_host, opts_.scheduler_port, small_limits(),
        worker_security(role::scheduler), std::size_t{1} << 20,
        [this](std::shared_ptr<transport::connection> c, std::function<void(hello_outcome)> then) {
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
    join_node(s.id, s.host, s.port, data_limits(), worker_security(role::server), opts_.chunk_bytes,
              [this, &s](std::shared_ptr<transport::connection> c,
                         std::function<void(hello_outcome)> then) {
                attach(s, std::move(c), std::move(then), /*joining=*/true);
              });
  }

  // Dials node `id` and has open(connection, then) start it on the io thread;
  // then() reports how its handshake ended. A handshake that the link cut short is tried again
  // on a new connection until connect_timeout: on a slow, lossy link it can outlast
  // handshake_timeout (two lost SYNs alone take 3 s). A refusal is final.
  template <class Open>
  void join_node(int id, const std::string& host, std::uint16_t port, wire::limits lim,
                 const transport_security& sec, std::size_t gather_bytes, Open open) {
    const auto deadline = clock::now() + opts_.connect_timeout;
    std::string lost;  // how the last attempt's handshake ended, once one did
    for (int attempt = 1;; ++attempt) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      std::shared_ptr<transport::connection> conn;
      try {
        conn = transport::dial(io_, host, port, std::max(left, std::chrono::milliseconds(1)),
                               id == scheduler_id ? "the scheduler" : node_name(id), *this, lim,
                               sec, gather_bytes);
      } catch (const error& e) {
        if (lost.empty()) throw;
        throw error(errc::unreachable, "join: " + lost + "; connecting again: " + e.what());
      }
      std::promise<hello_outcome> said;
      auto outcome = said.get_future();
      transport::asio::post(io_, [&] {
        try {
          open(std::move(conn), [&said](hello_outcome o) { said.set_value(std::move(o)); });
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

  // Takes the hello waiting for connection `c`'s handshake, if any (it runs once).
  std::optional<waiting_hello> take_hello(transport::connection& c) {
    std::lock_guard lk(m_);
    auto it = hellos_.find(&c);
    if (it == hellos_.end()) return std::nullopt;
    waiting_hello h = std::move(it->second);
    hellos_.erase(it);
    return h;
  }

 private:
  void on_authenticated(transport::connection& c) override {
    auto h = take_hello(c);
    if (!h) return;
    if (h->server_id == scheduler_id) return h->then({true, {}, false});  // no hello: join's reg
    say_hello(std::move(h->conn), h->server_id, std::move(h->then));
  }
};

}  // namespace kvstore::detail
