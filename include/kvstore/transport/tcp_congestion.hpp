// Which TCP congestion control a connection's socket runs (dist_options::tcp_congestion).
// Why it matters: a host whose default is BBR without the fq qdisc has the kernel pace every
// socket itself, a timer per burst. On loopback there is no link to protect, and that pacing
// halved kvstore's streamed 64 KiB pushes and pulls on a 2-core VM while it tripled the sending
// thread's CPU per frame (the README's numbers). So "auto" runs loopback connections on cubic,
// and leaves connections to other hosts on the host's choice.
#pragma once

#include <kvstore/error.hpp>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace kvstore::transport {

/// The congestion control the socket `fd` runs ("" when the kernel does not say).
inline std::string congestion_of(int fd) {
  char name[32] = {};
  socklen_t len = sizeof(name) - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return {};
  return std::string(name, ::strnlen(name, len));
}

/// Sets it; false when the kernel refuses (a name it does not know, or one outside
/// net.ipv4.tcp_allowed_congestion_control for an unprivileged process).
inline bool set_congestion(int fd, const std::string& name) {
  return ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                      static_cast<socklen_t>(name.size())) == 0;
}

/// True for 127.0.0.0/8, ::1 and 127.x mapped into IPv6.
inline bool is_loopback(const boost::asio::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return a.to_v6().to_v4().is_loopback();
  return a.is_loopback();
}

/// What `option` (dist_options::tcp_congestion) asks of a connection to `peer`: "auto" gives
/// "cubic" on loopback and nothing elsewhere, "system" nothing, any other value itself.
/// Nothing ("") keeps the host's default.
inline std::string congestion_choice(const std::string& option,
                                     const boost::asio::ip::address& peer) {
  if (option == "system") return {};
  if (option == "auto" || option.empty()) return is_loopback(peer) ? "cubic" : std::string();
  return option;
}

/// Applies the choice to a connected socket. Best effort: a name that the check at start
/// (check_congestion) let through cannot fail later, and "auto" keeps the host's default when
/// the kernel refuses cubic.
inline void apply_congestion(boost::asio::ip::tcp::socket& sock, const std::string& option) {
  boost::system::error_code ec;
  const auto peer = sock.remote_endpoint(ec);
  if (ec) return;
  const std::string name = congestion_choice(option, peer.address());
  if (!name.empty()) set_congestion(sock.native_handle(), name);
}

/// Throws kvstore::error(invalid_argument) naming the option when it names a congestion control
/// this process may not set (tried on a fresh socket), so a typo fails at start, not silently.
inline void check_congestion(const std::string& option) {
  if (option.empty() || option == "auto" || option == "system") return;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;  // no socket to try it on: the connections will fail louder
  const bool ok = option.size() < 16 && set_congestion(fd, option);
  ::close(fd);
  if (!ok)
    throw error(errc::invalid_argument,
                "dist_options::tcp_congestion (KVSTORE_TCP_CONGESTION) = \"" + option +
                    "\": the kernel does not let this process use it (see "
                    "/proc/sys/net/ipv4/tcp_allowed_congestion_control); \"auto\" and \"system\" "
                    "always work");
}

}  // namespace kvstore::transport
