// Drives a real transport::connection in-process: one end of a socketpair is the connection's
// socket, the fuzzer writes the other end, then closes it, and the io_context runs until the
// connection has closed. No TCP port, no threads: tens of thousands of inputs a second, and the
// code under test is the production parser (header -> meta -> payload, handshake, pre-auth
// limits), not a copy of it.
#pragma once

#include <kvstore/transport/auth.hpp>
#include <kvstore/transport/tcp_connection.hpp>
#include <kvstore/wire/frame.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace fuzz {

namespace asio = boost::asio;
using kvstore::transport::tcp;

inline constexpr const char* token = "fuzz-token";

/// Both ends of an AF_UNIX stream pair; `conn_end` becomes the connection's socket.
struct socket_pair {
  int conn_end = -1, peer = -1;
  socket_pair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
    conn_end = fds[0];
    peer = fds[1];
    // Room for a whole input, so the writes below never block.
    int big = 1 << 20;
    ::setsockopt(peer, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    ::setsockopt(conn_end, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    ::setsockopt(conn_end, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  }
  ~socket_pair() {
    if (peer >= 0) ::close(peer);
  }
  socket_pair(const socket_pair&) = delete;
  socket_pair& operator=(const socket_pair&) = delete;

  tcp::socket take_socket(asio::io_context& io) {
    tcp::socket s(io);
    s.assign(tcp::v4(), conn_end);  // a stream socket is all asio reads and writes need
    conn_end = -1;
    return s;
  }
  /// Writes all of `p` (the socket buffer holds it: inputs are capped below that).
  void write(const void* p, std::size_t n) {
    auto* b = static_cast<const char*>(p);
    while (n) {
      ssize_t k = ::send(peer, b, n, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EINTR) continue;
        return;  // the connection closed its end: the rest would be dropped anyway
      }
      b += k;
      n -= static_cast<std::size_t>(k);
    }
  }
  void close_writing() { ::shutdown(peer, SHUT_WR); }
  /// Reads exactly n bytes the connection wrote, running `io` while none are there (false if
  /// it closed first).
  bool read(asio::io_context& io, void* p, std::size_t n) {
    auto* b = static_cast<char*>(p);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (n) {
      ssize_t k = ::recv(peer, b, n, MSG_DONTWAIT);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (std::chrono::steady_clock::now() > deadline) std::abort();
        if (io.poll() == 0) io.run_for(std::chrono::milliseconds(1));
        if (io.stopped()) io.restart();
        continue;
      }
      if (k <= 0) return false;
      b += k;
      n -= static_cast<std::size_t>(k);
    }
    return true;
  }
};

/// An auth frame answering the acceptor's challenge (its meta) as a worker holding the token.
/// Over a socketpair neither end has an IP address, so the proof binds the empty one.
inline std::string auth_frame(std::string_view challenge_meta) {
  namespace tr = kvstore::transport;
  const auto c = tr::decode_challenge(challenge_meta);
  if (!c) std::abort();
  const std::string meta =
      tr::encode_auth(tr::answer_challenge(token, *c, kvstore::role::worker, true, ""));
  kvstore::wire::header a;
  a.command = kvstore::wire::cmd::auth;
  a.meta_len = static_cast<std::uint32_t>(meta.size());
  auto h = kvstore::wire::encode(a);
  return std::string(reinterpret_cast<const char*>(h.data()), h.size()) + meta;
}

/// Reads the challenge the acceptor sends first; returns its meta (empty if none came).
inline std::string read_challenge(asio::io_context& io, socket_pair& sp) {
  kvstore::wire::header_bytes hb;
  if (!sp.read(io, hb.data(), hb.size())) return {};
  kvstore::wire::header h;
  std::string why;
  if (!kvstore::wire::decode(hb.data(), h, kvstore::wire::limits{}, why) ||
      h.command != kvstore::wire::cmd::challenge ||
      h.meta_len != kvstore::transport::challenge_size)
    std::abort();  // the acceptor must open with a well-formed challenge
  std::string meta(h.meta_len, '\0');
  if (!sp.read(io, meta.data(), meta.size())) return {};
  return meta;
}

/// Runs `io` until the connection has closed; a connection still open a few seconds after its
/// peer closed is a hang, reported as a crash.
inline void run_until_closed(asio::io_context& io, kvstore::transport::connection& c) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!c.is_closed()) {
    io.run_for(std::chrono::milliseconds(50));
    if (io.stopped()) io.restart();
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "connection still open 5 s after its peer closed: a hang\n");
      std::abort();
    }
  }
  io.poll();  // let completion handlers of the close run
}

inline kvstore::transport::security acceptor_security() {
  kvstore::transport::security s;
  s.token = token;
  s.acceptor = true;
  s.handshake_timeout =
      std::chrono::milliseconds(0);  // the peer's close ends each run, not a timer
  return s;
}

}  // namespace fuzz
