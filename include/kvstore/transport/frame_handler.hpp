// What the owner of a connection (worker, server, scheduler) implements: the calls a connection
// makes into it. Its own header because the connection's state (transport/connection_state.hpp)
// holds a handler before the connection itself is declared; it needs no Asio.
#pragma once

#include <kvstore/wire/frame.hpp>

#include <cstddef>
#include <span>
#include <string>

namespace kvstore::transport {

class connection;

/// What the owner of a connection (worker, server, scheduler) implements.
class frame_handler {
 public:
  virtual ~frame_handler() = default;
  /// Where the payload of `h` should be read to; an empty span lets the connection use its own
  /// buffer. A non-empty span must be exactly h.payload_len bytes and stay valid until on_frame.
  virtual std::span<std::byte> payload_sink(connection&, const wire::header&) { return {}; }
  /// A whole frame arrived. Throwing a kvstore::error closes this connection with that reason.
  virtual void on_frame(connection&, const wire::header&, std::string meta,
                        std::span<const std::byte> payload) = 0;
  /// The peer proved the token; frames from it follow.
  virtual void on_authenticated(connection&) {}
  /// The connection closed (by the peer, an error, or close()); called once.
  virtual void on_close(connection&, const std::string& reason) = 0;
};

}  // namespace kvstore::transport
