// A scripted peer speaking the wire protocol by hand over a plain TCP socket: it answers a
// server's challenge like a worker (and checks the server's proof), sends frames that are right,
// wrong or only half there, and reads answers or the close. For the tests of hostile and broken
// peers (tests/cluster/test_dist_faults.cpp, tests/process/test_hostile.cpp).
#pragma once

#include <kvstore/node.hpp>
#include <kvstore/transport/auth.hpp>
#include <kvstore/transport/identity.hpp>
#include <kvstore/wire/frame.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>

namespace kvtest {

struct wire_peer {
  int fd = -1;
  explicit wire_peer(std::uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~wire_peer() {
    if (fd >= 0) ::close(fd);
  }
  bool send_bytes(const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n) {
      ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      c += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }
  bool send_frame(kvstore::wire::header h, const std::string& meta = {},
                  const std::string& payload = {}) {
    h.meta_len = static_cast<std::uint32_t>(meta.size());
    h.payload_len = payload.size();
    auto b = kvstore::wire::encode(h);
    return send_bytes(b.data(), b.size()) && send_bytes(meta.data(), meta.size()) &&
           send_bytes(payload.data(), payload.size());
  }
  // Answers the acceptor's challenge as a worker with the proof of `token` (empty: the job has
  // no token), bound to this socket's address, and checks the acceptor's proof.
  bool handshake(const std::string& token = {}) {
    namespace tr = kvstore::transport;
    kvstore::wire::header h;
    std::string meta;
    if (!read_frame(h, meta) || h.command != kvstore::wire::cmd::challenge) return false;
    const auto c = tr::decode_challenge(meta);
    if (!c) return false;
    sockaddr_in self{};
    socklen_t len = sizeof self;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len);
    const std::string addr = "127.0.0.1:" + std::to_string(ntohs(self.sin_port));
    const auto a = tr::answer_challenge(token, *c, kvstore::role::worker, true, addr);
    kvstore::wire::header ah;
    ah.command = kvstore::wire::cmd::auth;
    if (!send_frame(ah, tr::encode_auth(a))) return false;
    std::string proof;
    if (!read_frame(h, proof) || h.command != kvstore::wire::cmd::auth ||
        !tr::same_proof(tr::acceptor_proof(token, tr::transcript(*c, a, addr)), proof))
      return false;
    binding = c->nonce + a.nonce;  // what connection::binding() holds on both ends
    return true;
  }
  // The connection's binding after handshake() (transport::connection::binding(): both nonces).
  std::string binding;
  // Reads exactly n bytes; false on EOF, error or deadline.
  bool read_exact(void* p, std::size_t n, std::chrono::milliseconds timeout) {
    char* c = static_cast<char*>(p);
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return false;
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, static_cast<int>(left)) <= 0) return false;
      ssize_t r = ::recv(fd, c, n, 0);
      if (r <= 0) return false;
      c += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  // Reads one frame (header, meta; the payload into `payload`, or skipped).
  bool read_frame(kvstore::wire::header& h, std::string& meta, std::string* payload = nullptr) {
    kvstore::wire::header_bytes b;
    if (!read_exact(b.data(), b.size(), std::chrono::seconds(10))) return false;
    std::string why;
    kvstore::wire::limits lim;
    if (!kvstore::wire::decode(b.data(), h, lim, why)) return false;
    meta.resize(h.meta_len);
    if (!read_exact(meta.data(), meta.size(), std::chrono::seconds(10))) return false;
    std::string skipped;
    std::string& p = payload ? *payload : skipped;
    p.assign(h.payload_len, '\0');
    return read_exact(p.data(), p.size(), std::chrono::seconds(10));
  }
  // Sends worker `rank`'s hello to server `server_id` with the identity proof of `credential`
  // (from the scheduler's address book), bound to this connection.
  bool hello(int rank, const std::string& credential, int server_id) {
    kvstore::wire::header h;
    h.command = kvstore::wire::cmd::hello;
    h.aux = static_cast<std::uint64_t>(rank);
    return send_frame(h, kvstore::transport::hello_proof(credential, binding, server_id, rank));
  }
  // Writes `bytes` again and again and reads nothing, until the peer has taken no byte for
  // `stall` or `limit` has passed. Returns how many whole copies went out.
  std::size_t flood(const std::string& bytes, std::chrono::milliseconds limit,
                    std::chrono::milliseconds stall) {
    const auto until = std::chrono::steady_clock::now() + limit;
    std::size_t sent = 0, at = 0;
    while (std::chrono::steady_clock::now() < until) {
      pollfd pf{fd, POLLOUT, 0};
      if (::poll(&pf, 1, static_cast<int>(stall.count())) <= 0) break;  // the peer stopped
      const ssize_t w =
          ::send(fd, bytes.data() + at, bytes.size() - at, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) continue;
        break;
      }
      at += static_cast<std::size_t>(w);
      if (at == bytes.size()) {
        at = 0;
        ++sent;
      }
    }
    return sent;
  }
  // True once the peer has closed the connection (EOF or reset) within the timeout; bytes sent
  // before the close are skipped.
  bool closed_by_peer(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return false;
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, static_cast<int>(left)) <= 0) return false;
      ssize_t r = ::recv(fd, buf, sizeof buf, 0);
      if (r <= 0) return true;
    }
  }
};

inline kvstore::wire::header hdr(kvstore::wire::cmd c) {
  kvstore::wire::header h;
  h.command = c;
  return h;
}

}  // namespace kvtest
