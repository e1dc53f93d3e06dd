// The first steps of a TCP link (transport/tcp_connection.hpp): TLS when it is on, then the
// token handshake, whose rules are transport/handshake.hpp's (this file reads and writes its
// frames), and the deadlines: the handshake's, then the idle one. `Link` is the connection
// type itself (CRTP), which reads, writes and fails; these steps only call it.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/transport/connection_state.hpp>
#include <kvstore/transport/endpoint.hpp>
#include <kvstore/transport/handshake.hpp>
#include <kvstore/transport/tls.hpp>
#include <kvstore/wire/frame.hpp>

#include <boost/asio.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace kvstore::transport {

template <class Link>
class tcp_handshake : public connection_state {
 protected:
  using connection_state::connection_state;

  // TLS first (when on, within the handshake deadline), then the token challenge.
  void begin() {
    if (closed_flag_) return;
    std::shared_ptr<ssl::context> ctx;
    try {
      ctx = tls_context(sec_);
    } catch (const std::exception& e) {
      return link().fail(e.what());
    }
    if (ctx) {
      tls_ = std::make_unique<ssl::stream<tcp::socket&>>(sock_, *ctx);
      arm_timer(sec_.handshake_timeout, true);
      tls_->async_handshake(sec_.acceptor ? ssl::stream_base::server : ssl::stream_base::client,
                            [self = self_as<Link>()](boost::system::error_code ec) {
                              if (ec) return self->fail("TLS handshake: " + ec.message());
                              self->begin_token();
                            });
      return;
    }
    begin_token();
  }

  // A frame of the handshake: the step transport/handshake.hpp decides, carried out.
  void handshake(const wire::header& h, const std::string& meta) {
    auto step = hs_.on_frame(h, meta, connector_address(sock_, sec_.acceptor));
    if (!step.refuse.empty()) return refuse(step.refuse);
    if (!step.fail.empty()) return link().fail(step.fail);
    if (step.proven) peer_proven();
    if (!step.send) {
      if (step.proven) writes_open();
      return;
    }
    // A proof of ours goes out before any frame of ours.
    std::function<void()> then;
    if (step.proven) then = [self = self_as<Link>()] { self->writes_open(); };
    send_handshake(step.cmd, std::move(step.meta), std::move(then));
  }

 private:
  Link& link() { return static_cast<Link&>(*this); }

  void begin_token() {
    if (closed_flag_) return;
    // Until the peer is proven: small frames without payload, within the deadline.
    full_limits_ = limits_;
    limits_.max_payload = 0;
    limits_.max_meta = hs_.max_meta();
    const auto first = hs_.start();
    if (first.send) send_handshake(first.cmd, first.meta, {});
    arm_timer(sec_.handshake_timeout, true);
    link().read_more();
  }

  // Writes one handshake frame (nothing else is written before the handshake ends), then runs
  // `then` (if any) once it is out.
  void send_handshake(wire::cmd c, std::string meta, std::function<void()> then) {
    wire::header h;
    h.command = c;
    h.meta_len = static_cast<std::uint32_t>(meta.size());
    hs_hdr_ = wire::encode(h);
    hs_meta_ = std::move(meta);
    std::array<asio::const_buffer, 2> b{asio::buffer(hs_hdr_), asio::buffer(hs_meta_)};
    io([&](auto& st) {
      asio::async_write(st, b,
                        [self = self_as<Link>(), then = std::move(then)](
                            boost::system::error_code ec, std::size_t) {
                          if (ec) return self->lose_link("write: " + ec.message());
                          if (then) then();
                        });
    });
  }

  // Says why before closing, so a misconfigured node reports a wrong token, not a mystery.
  void refuse(const std::string& why) {
    wire::header r;
    r.command = wire::cmd::response;
    r.status = static_cast<std::uint32_t>(errc::auth_failed);
    hs_hdr_ = wire::encode(r);
    closing_ = true;
    io([&](auto& st) {
      asio::async_write(st, asio::buffer(hs_hdr_),
                        [self = self_as<Link>(), why](boost::system::error_code, std::size_t) {
                          self->fail(why);
                        });
    });
  }

  // The peer proved the token: full limits and buffer, the idle deadline, the owner told.
  void peer_proven() {
    limits_ = full_limits_;
    rbuf_.resize(read_buffer_size);
    proven_ = true;
    arm_timer(sec_.idle_timeout, false);
    handler_->on_authenticated(*this);
  }
  // This end's part of the handshake is out: queued frames may follow.
  void writes_open() {
    if (closed_flag_) return;
    authed_ = true;
    link().start_writing();
  }

  // Handshake deadline, then (if set) the idle deadline, checked a few times per period.
  void arm_timer(std::chrono::milliseconds period, bool handshake) {
    timer_.cancel();
    if (period.count() <= 0) return;
    last_rx_ = std::chrono::steady_clock::now();
    timer_.expires_after(handshake ? period : period / 4 + std::chrono::milliseconds(1));
    timer_.async_wait([self = self_as<Link>(), period, handshake](boost::system::error_code ec) {
      if (ec || self->closed_flag_) return;
      if (handshake) {
        if (!self->proven_)
          self->lose_link("no authentication within " + std::to_string(period.count()) + " ms");
        return;
      }
      self->check_idle(period);
    });
  }
  void check_idle(std::chrono::milliseconds period) {
    auto now = std::chrono::steady_clock::now();
    if (now - last_rx_ > period)
      return link().lose_link("idle for more than " + std::to_string(period.count()) + " ms");
    timer_.expires_after(period / 4 + std::chrono::milliseconds(1));
    timer_.async_wait([self = self_as<Link>(), period](boost::system::error_code ec) {
      if (!ec && !self->closed_flag_) self->check_idle(period);
    });
  }
};

}  // namespace kvstore::transport
