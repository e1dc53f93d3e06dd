// What a connection holds (socket, TLS stream, writer, read buffer, handshake, flags) and the
// steps that start no asynchronous wait and call no handler: its accessors, the read buffer's
// housekeeping, back-pressure. Every step that waits captures the connection's shared_ptr, so it
// stays in transport/tcp_handshake.hpp or tcp_connection.hpp, which derive from this.
#pragma once

#include <kvstore/node.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/endpoint.hpp>
#include <kvstore/transport/frame_handler.hpp>
#include <kvstore/transport/frame_writer.hpp>
#include <kvstore/transport/handshake.hpp>
#include <kvstore/transport/security.hpp>
#include <kvstore/transport/tcp_congestion.hpp>
#include <kvstore/transport/tls.hpp>
#include <kvstore/wire/frame.hpp>

#include <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::transport {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// How a connection proves itself. The accepting side challenges, the connecting side answers;
/// until the answer checks out the acceptor reads nothing but it, under tight limits and a
/// deadline. After that, a connection silent for longer than idle_timeout (0: never) is closed.
using security = transport_security;

class connection_state : public connection {
 public:
  /// Read buffer before the peer is proven (the handshake's frames fit) and after.
  static constexpr std::size_t handshake_buffer_size = 512;
  static constexpr std::size_t read_buffer_size = std::size_t{64} << 10;
  /// A payload's rest of at most this many bytes is read through the read buffer, not
  /// straight into its sink.
  static constexpr std::size_t small_rest_bytes = std::size_t{8} << 10;

  // The connection interface's accessors (transport/connection.hpp says what each means).
  bool authenticated() const noexcept override { return proven_.load(); }
  kvstore::role peer_proven_role() const noexcept override { return hs_.peer_role(); }
  // The peer may answer a frame before the sendmsg that wrote it has returned (and sanitizers
  // read the frame's buffers after the syscall): a worker calls this before completing a
  // request on its answer, so a caller that frees a pushed buffer once its op is done never
  // races the call still reading it. The wait is at most the rest of one non-blocking sendmsg.
  void sync_with_direct_writes() const noexcept override { writer_.sync_with_direct_writes(); }
  // Bytes that arrive meanwhile wait in the socket.
  void pause_reading() override { paused_by_owner_ = true; }
  // The handshake's nonces.
  const std::string& binding() const noexcept override { return hs_.binding(); }
  std::size_t queued_bytes() const noexcept override { return writer_.queued_bytes(); }
  bool is_closed() const noexcept override { return closed_flag_.load(); }
  // Lost: the peer closed it, a read or write failed, or a deadline of ours passed (the
  // handshake's, the idle one); a refused token, proof or frame would be refused again.
  bool link_lost() const noexcept override { return link_lost_; }
  const std::string& remote() const noexcept override { return remote_; }
  tcp::socket::executor_type executor() { return sock_.get_executor(); }

 protected:
  connection_state(tcp::socket sock, frame_handler& handler, wire::limits lim, security sec,
                   std::size_t gather_bytes = std::size_t{1} << 20)
      : sock_(std::move(sock)),
        timer_(sock_.get_executor()),
        handler_(&handler),
        limits_(lim),
        sec_(std::move(sec)),
        writer_(gather_bytes),
        remote_(remote_address(sock_)),
        hs_(sec_, remote_) {
    boost::system::error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);
    apply_congestion(sock_, sec_.tcp_congestion);
    rbuf_.resize(handshake_buffer_size);  // 64 KiB once the peer is proven
  }

  // Runs f on the stream all IO uses: the TLS stream when TLS is on, else the socket.
  template <class F>
  void io(F&& f) {
    if (tls_)
      f(*tls_);
    else
      f(sock_);
  }

  static std::string errno_message(int e) {
    return boost::system::error_code(e, boost::system::system_category()).message();
  }

  // The buffer's unparsed bytes move to its front (parse() leaves fewer than a header's).
  void restart_buffer() {
    if (rbeg_ == 0) return;
    const std::size_t n = rend_ - rbeg_;
    std::memmove(rbuf_.data(), rbuf_.data() + rbeg_, n);
    rend_ = n;
    rbeg_ = 0;
  }

  // The first n bytes of own_ become the sink. own_ keeps its size from frame to frame (up to
  // 4 MiB, deliver()), so only bytes it never had are zeroed: cleared and grown again, it was
  // zeroed whole for every frame (1.2% of a 1 x 1 cluster pushing fused 4 KiB keys).
  void grow_own(std::size_t n) {
    if (own_.size() < n) own_.resize(n);
    sink_ = std::span<std::byte>(own_.data(), n);
  }

  // Reading waits while the owner paused it, or while the peer leaves more than
  // max_queued_bytes of answers unread (it goes on below half of that).
  bool must_stall() const {
    if (paused_by_owner_) return true;
    const std::size_t cap = sec_.max_queued_bytes;
    return proven_ && cap && writer_.queued_bytes() > (stalled_ ? cap / 2 : cap);
  }

  enum class stage { header, meta, payload };

  tcp::socket sock_;
  std::unique_ptr<ssl::stream<tcp::socket&>> tls_;  // set when TLS is on: all IO goes through it
  asio::steady_timer timer_;
  frame_handler* handler_;
  wire::limits limits_;
  wire::limits full_limits_;
  security sec_;
  frame_writer writer_;
  std::atomic<bool> authed_{false};  // this end's handshake frames are out: frames may follow
  std::atomic<bool> proven_{false};  // the peer proved the token (and its role)
  std::string hs_meta_;
  bool paused_by_owner_ = false;  // pause_reading()
  bool stalled_ = false;          // parse() stopped at a frame boundary; maybe_resume() goes on
  bool closing_ = false;          // refused: reading stops, the refusal is being written
  wire::header_bytes hs_hdr_{};
  std::chrono::steady_clock::time_point last_rx_{};
  std::string remote_;
  token_handshake hs_;  // the handshake's rules (reads sec_)

  std::vector<std::byte> rbuf_;
  std::size_t rbeg_ = 0, rend_ = 0;
  stage stage_ = stage::header;
  wire::header cur_;
  std::string meta_;
  std::span<std::byte> sink_;
  std::vector<std::byte> own_;
  bool own_sink_ = false;   // the payload goes to own_, grown as it arrives
  bool link_lost_ = false;  // set on the io thread before fail() (see link_lost)
  std::size_t got_ = 0;
  // Payloads read straight into their sinks since the io thread last came back from asio.
  int sink_reads_in_row_ = 0;
  static constexpr int max_sink_reads_in_row = 16;

  std::atomic<bool> closed_flag_{false};
};

}  // namespace kvstore::transport
