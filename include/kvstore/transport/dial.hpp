// How a node reaches a peer it names by host and port: TCP (with retries until the deadline),
// or, for the host "inproc", this process's in-process network. The one place that picks the
// link; the protocol code above gets a connection either way.
#pragma once

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

}  // namespace kvstore::transport
