// How a node reaches a peer it names by host and port: TCP (with retries until the deadline),
// or, for the host "inproc", this process's in-process network. The one place that picks the
// link; the protocol code above gets a connection either way.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/endpoint.hpp>
#include <kvstore/transport/inproc.hpp>
#include <kvstore/transport/security.hpp>
#include <kvstore/transport/tcp_connection.hpp>
#include <kvstore/wire/frame.hpp>

#include <boost/asio.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace kvstore::transport {

/// A connection to `what` at host:port whose frames go to `h` on `io`'s thread; not started.
/// Throws kvstore::error(unreachable) when nothing answers within `timeout`.
inline std::shared_ptr<connection> dial(asio::io_context& io, const std::string& host,
                                        std::uint16_t port, std::chrono::milliseconds timeout,
                                        const std::string& what, frame_handler& h, wire::limits lim,
                                        transport_security sec,
                                        std::size_t gather_bytes = std::size_t{1} << 20) {
  if (is_inproc(host))
    return inproc_network::get().dial(port, {io.get_executor(), &h, std::move(sec), lim}, timeout,
                                      what);
  return std::make_shared<tcp_connection>(connect_with_retry(io, host, port, timeout, what), h, lim,
                                          std::move(sec), gather_bytes);
}

/// One try at `dial`'s connection without blocking `io`'s thread (a worker reconnecting to a
/// restarted server from its io thread): then(connection, "") once it is open (not started), or
/// then(nullptr, why) when it cannot be. Call on `io`'s thread; `then` runs there.
template <class Then>
void dial_once(asio::io_context& io, const std::string& host, std::uint16_t port,
               const std::string& what, frame_handler& h, wire::limits lim, transport_security sec,
               std::size_t gather_bytes, Then then) {
  if (is_inproc(host)) {
    std::shared_ptr<connection> c;
    try {  // nothing to wait for in this process: the port has a listener now or not
      c = dial(io, host, port, std::chrono::milliseconds(0), what, h, lim, std::move(sec));
    } catch (const error& e) {
      return then(nullptr, std::string(e.what()));
    }
    return then(std::move(c), std::string());
  }
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec) return then(nullptr, "bad address " + host);
  auto sock = std::make_shared<tcp::socket>(io);
  sock->async_connect(tcp::endpoint(addr, port), [&h, lim, sec = std::move(sec), gather_bytes, sock,
                                                  then = std::move(then)](
                                                     boost::system::error_code e) mutable {
    if (e) return then(nullptr, e.message());
    then(std::make_shared<tcp_connection>(std::move(*sock), h, lim, std::move(sec), gather_bytes),
         std::string());
  });
}

}  // namespace kvstore::transport
