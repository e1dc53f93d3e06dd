// Where a server's shard sends its answers to one worker: the worker's connection, held weakly (an
// answer queued behind a round may outlive it, and is then dropped), each frame stamped with the
// server's node id. The shard (server/shard.hpp) is written against this Port; the node loop
// (server/server.hpp) makes one per request.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/wire/frame.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace kvstore::detail {

/// Where the shard's answers to one worker go: its connection (it may have closed since), with
/// the server's node id as the sender (the address book may set it after the request came).
struct connection_port {
  std::weak_ptr<transport::connection> conn;
  const int* sender = nullptr;

  void reply(std::uint64_t req, errc status, std::string msg) const {
    wire::header h;
    h.command = wire::cmd::response;
    h.req_id = req;
    h.status = static_cast<std::uint32_t>(status);
    send(h, {}, {}, std::move(msg));
  }
  /// An ok answer to pushes first .. first + n - 1 (wire::acks_header), merged by the connection
  /// with the acks queued before it.
  void ack(std::uint64_t first, std::uint64_t n) const {
    auto c = conn.lock();
    if (!c) return;
    wire::header h = wire::acks_header(first, n);
    h.sender = *sender;
    c->send_acks(h);
  }
  bool same_peer(const connection_port& o) const {
    return !conn.owner_before(o.conn) && !o.conn.owner_before(conn);
  }
  void send(const wire::header& h, std::span<const std::byte> payload,
            std::shared_ptr<const void> keep, std::string meta = {}) const {
    auto c = conn.lock();
    if (!c) return;
    transport::out_frame f;
    f.h = h;
    f.h.sender = *sender;
    f.meta = std::move(meta);
    f.payload = payload.data();
    f.payload_len = payload.size();
    f.keep = std::move(keep);
    c->send(std::move(f));
  }
};

}  // namespace kvstore::detail
