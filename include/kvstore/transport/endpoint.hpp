// TCP endpoints as this library names and reaches them: a socket's ends as "ip:port" text (for
// errors, and for the address the handshake's proofs cover), whether a host name can resolve at
// all, and connecting with retries until a deadline.
#pragma once

#include <kvstore/error.hpp>

#include <boost/asio.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

namespace kvstore::transport {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// The peer's address of a connected socket as "ip:port" ("?" when it has none).
inline std::string remote_address(const tcp::socket& sock) {
  boost::system::error_code ec;
  const auto ep = sock.remote_endpoint(ec);
  if (ec) return "?";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

/// The connector's address as this end of `sock` sees it ("ip:port"; "" for a socket without
/// one): the peer's on the accepting end, the local one on the connecting end.
inline std::string connector_address(tcp::socket& sock, bool acceptor) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  auto* sa = reinterpret_cast<sockaddr*>(&ss);
  const int fd = sock.native_handle();
  if ((acceptor ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return {};
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    asio::ip::address_v4 a(ntohl(in->sin_addr.s_addr));
    return a.to_string() + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<sockaddr_in6*>(&ss);
    asio::ip::address_v6::bytes_type bytes;
    std::memcpy(bytes.data(), &in->sin6_addr, bytes.size());
    asio::ip::address_v6 a(bytes);
    const std::string host = a.is_v4_mapped()
                                 ? asio::ip::make_address_v4(asio::ip::v4_mapped, a).to_string()
                                 : a.to_string();
    return host + ":" + std::to_string(ntohs(in->sin6_port));
  }
  return {};
}

/// Whether `host` can ever resolve: an IPv4 or IPv6 literal, or a DNS name (labels of letters,
/// digits, '-' and '_', at most 63 bytes each, 253 in all). A URL, a "host:port" or a bracketed
/// address cannot, and is not worth retrying.
inline bool plausible_host(std::string_view host) {
  boost::system::error_code ec;
  asio::ip::make_address(std::string(host), ec);
  if (!ec) return true;
  if (host.empty() || host.size() > 253) return false;
  std::size_t label = 0;
  for (char c : host) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok || ++label > 63) return false;
  }
  return true;
}

/// Connects to host:port, retrying refused connections until the deadline (the peer may not be
/// listening yet). Runs on the caller's thread with its own short-lived io_context per attempt.
inline tcp::socket connect_with_retry(asio::io_context& io, const std::string& host,
                                      std::uint16_t port, std::chrono::milliseconds timeout,
                                      const std::string& what) {
  if (!plausible_host(host))
    throw error(errc::invalid_argument,
                "cannot reach " + what + " at \"" + host + "\": not a host name or an IP address");
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no attempt";
  for (int attempt = 0;; ++attempt) {
    asio::io_context tmp;
    tcp::socket s(tmp);
    boost::system::error_code ec;
    tcp::resolver r(tmp);
    auto eps = r.resolve(host, std::to_string(port), ec);
    if (!ec) {
      bool done = false;
      asio::steady_timer t(tmp);
      auto left = deadline - std::chrono::steady_clock::now();
      t.expires_after(
          std::max<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(1)));
      asio::async_connect(s, eps, [&](boost::system::error_code e, const tcp::endpoint&) {
        ec = e;
        done = true;
        t.cancel();
      });
      t.async_wait([&](boost::system::error_code e) {
        if (!e && !done) s.close();
      });
      tmp.run();
      if (!ec && s.is_open()) {
        // Move the connected descriptor onto the caller's io_context.
        auto proto = s.local_endpoint().protocol();
        int fd = s.release();
        return tcp::socket(io, proto, fd);
      }
    }
    last = ec ? ec.message() : "timed out";
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 * (attempt + 1), 250)));
  }
  throw error(errc::unreachable, "cannot reach " + what + " at " + host + ":" +
                                     std::to_string(port) + " within " +
                                     std::to_string(timeout.count()) + " ms (" + last + ")");
}

}  // namespace kvstore::transport
