// The seam between the protocol (worker, server, scheduler) and the link that carries its
// frames: send a frame, receive frames (frame_handler), close. Two links implement it: TCP with
// TLS and the token handshake (transport/tcp_connection.hpp), and an in-process pair for a
// worker and a server in one process without sockets (transport/inproc.hpp). Which one a node
// gets is the host it names (transport/dial.hpp); the protocol code never knows.
#pragma once

#include <kvstore/node.hpp>
#include <kvstore/transport/frame_handler.hpp>
#include <kvstore/transport/out_frame.hpp>
#include <kvstore/wire/frame.hpp>

#include <cstddef>
#include <memory>
#include <string>

namespace kvstore::transport {

// Owners and the protocol hold connections by shared_ptr (weak_from_this() for answers that
// may outlive one).
class connection : public std::enable_shared_from_this<connection> {
 public:
  virtual ~connection() = default;

  /// Starts the link (its handshake, then reading). Call once, after the owner has stored the
  /// shared_ptr. Frames sent before the link is proven wait for it.
  virtual void start() = 0;
  /// Queues a frame; thread-safe. Frames of equal priority go out in the order queued. With
  /// `may_write_now` a link may write from the calling thread when nothing else is queued.
  virtual void send(out_frame&& f, bool may_write_now = false) = 0;
  /// Queues `h`, an ok answer to pushes (wire::acks_header, sender set); thread-safe.
  virtual void send_acks(const wire::header& h) {
    out_frame f;
    f.h = h;
    send(std::move(f));
  }
  /// Closes the link (from any thread); the handler's on_close runs once with `reason`.
  virtual void close(std::string reason) = 0;
  /// Stops handing frames to the owner after the current one (from the io thread, e.g. inside
  /// on_frame); resume_reading() (from any thread) goes on where it stopped.
  virtual void pause_reading() = 0;
  virtual void resume_reading() = 0;

  /// True once the peer proved the token (and, to a connector, the role it was dialed as).
  virtual bool authenticated() const noexcept = 0;
  /// The role the peer proved (valid once authenticated()).
  virtual kvstore::role peer_proven_role() const noexcept = 0;
  /// What identifies this proven link on both ends: a proof bound to it cannot be replayed on
  /// another. Empty before the peer is proven.
  virtual const std::string& binding() const noexcept = 0;
  /// Bytes of frames queued and not yet taken by the link.
  virtual std::size_t queued_bytes() const noexcept = 0;
  virtual bool is_closed() const noexcept = 0;
  /// Closed by the link, not by a refusal: a new connection may succeed where this one did not.
  virtual bool link_lost() const noexcept = 0;
  /// The peer's address, for messages ("ip:port", or "inproc:port").
  virtual const std::string& remote() const noexcept = 0;
  /// Returns once no caller's thread is still writing a frame this link took with
  /// may_write_now (see tcp_connection); a link that never writes from callers has nothing to do.
  virtual void sync_with_direct_writes() const noexcept {}

  /// Owner's tag for the peer (role, rank, node id), set after its hello.
  int peer_id = -1;
  int peer_rank = -1;
  int peer_role = -1;
  bool said_bye = false;

 protected:
  // This connection's shared_ptr as its own type, for the handlers an implementation posts.
  template <class Self>
  std::shared_ptr<Self> self_as() {
    return std::static_pointer_cast<Self>(shared_from_this());
  }
};

}  // namespace kvstore::transport
