// One direction of a relay between two sockets on one io_context, for the tests that put
// something between a worker and a node: test_security's man in the middle and test_dist_faults'
// lossy link.
#pragma once

#include <boost/asio.hpp>

#include <array>
#include <cstddef>
#include <memory>

namespace kvtest {

using socket_ptr = std::shared_ptr<boost::asio::ip::tcp::socket>;

/// Copies what `from` reads to `to` (drops it when `to` is null) until either side closes or
/// fails; then closes both.
inline void pipe_bytes(socket_ptr from, socket_ptr to) {
  auto buf = std::make_shared<std::array<char, 16384>>();
  from->async_read_some(boost::asio::buffer(*buf),
                        [from, to, buf](boost::system::error_code ec, std::size_t n) {
                          boost::system::error_code wec;
                          if (!ec && to) boost::asio::write(*to, boost::asio::buffer(*buf, n), wec);
                          if (ec || wec) {
                            from->close(wec);
                            if (to) to->close(wec);
                            return;
                          }
                          pipe_bytes(from, to);
                        });
}

}  // namespace kvtest
