// The send side of one connection (transport/tcp_connection.hpp): the queue of unsent frames
// (send_queue.hpp), a caller's direct write of a frame when nothing else is queued, and the
// gathered write in progress: the frames it took and their buffers, one iovec each piece, sent
// by non-blocking sendmsg calls of up to IOV_MAX buffers (socket_io.hpp). It owns no socket and
// starts no asynchronous work: the connection drives it from its io thread and waits on the
// socket where a call says so.
#pragma once

#include <kvstore/detail/spin_mutex.hpp>
#include <kvstore/transport/out_frame.hpp>
#include <kvstore/transport/send_queue.hpp>
#include <kvstore/transport/socket_io.hpp>
#include <kvstore/wire/frame.hpp>

#include <boost/asio/buffer.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

namespace kvstore::transport {

class frame_writer {
 public:
  /// Frames one write gathers at most (within gather_bytes).
  static constexpr std::size_t max_gathered_frames = 256;

  explicit frame_writer(std::size_t gather_bytes) : gather_bytes_(gather_bytes) {}

  /// What queue() left to the connection.
  enum class queued {
    done,   // written whole from the caller's thread, dropped (closed), or behind a write
    start,  // the io thread must start writing (write_more)
  };

  /// Queues a frame; thread-safe. With `direct_fd` (>= 0: the plain socket, the handshake's
  /// frames out), a frame without pieces sent while nothing else is queued or being written
  /// goes to the socket from the calling thread (one non-blocking sendmsg); what the socket
  /// does not take is finished first by the io thread.
  queued queue(out_frame&& f, int direct_fd, bool writes_open) {
    f.h.payload_len = f.payload_len;
    f.h.meta_len = static_cast<std::uint32_t>(f.meta.size());
    std::lock_guard lk(qm_);
    if (closed_) return queued::done;
    if (direct_fd >= 0 && f.pieces.empty() && !writing_ && queue_.empty()) {
      const std::size_t sent = write_now(direct_fd, f);
      if (sent == frame_bytes(f)) return queued::done;
      // The rest goes first, from the io thread.
      queued_bytes_ += frame_bytes(f);
      partial_.push_back(std::move(f));
      partial_skip_ = sent;
      writing_ = true;
      return queued::start;
    }
    const std::size_t bytes = frame_bytes(f);
    if (queue_.push(std::move(f))) queued_bytes_ += bytes;  // (else merged into an ack)
    if (writing_ || !writes_open) return queued::done;
    writing_ = true;
    return queued::start;
  }

  /// Extends the acks queued last with `h` when it continues them (send_queue::extend_acks);
  /// false when it must be queued as a frame of its own. Thread-safe.
  bool extend_acks(const wire::header& h) {
    std::lock_guard lk(qm_);
    return closed_ || queue_.extend_acks(h);
  }

  /// The connection's handshake is out: true when queued frames wait for a write to start.
  bool begin_writing() {
    std::lock_guard lk(qm_);
    if (writing_ || queue_.empty() || closed_) return false;
    writing_ = true;
    return true;
  }

  /// Takes queued frames, highest priority first, up to about gather_bytes (a later
  /// higher-priority frame waits for at most that much), and builds their buffers: iovecs from
  /// next() on, and with `tls` the same as asio buffers (tls_buffers()). False, writing over,
  /// when there is nothing to write.
  bool gather(bool tls) {
    std::size_t skip = 0;
    {
      std::lock_guard lk(qm_);
      if (closed_ || (queue_.empty() && partial_.empty())) {
        writing_ = false;
        return false;
      }
      inflight_.clear();
      if (!partial_.empty()) {
        // A frame the caller's thread began (write_now): its rest goes before anything else.
        inflight_.swap(partial_);
        skip = partial_skip_;
        partial_skip_ = 0;
      }
      std::size_t bytes = 0;
      while (!queue_.empty() && inflight_.size() < max_gathered_frames &&
             (inflight_.empty() || bytes < gather_bytes_)) {
        inflight_.push_back(std::move(queue_.front()));
        queue_.pop();
        bytes += frame_bytes(inflight_.back());
      }
    }
    wiov_.clear();
    auto add = [&](const void* p, std::size_t len) {
      wiov_.push_back({const_cast<void*>(p), len});
    };
    hdrs_.resize(inflight_.size());
    for (std::size_t i = 0; i < inflight_.size(); ++i) {
      auto& f = inflight_[i];
      hdrs_[i] = wire::encode(f.h);
      add(hdrs_[i].data(), hdrs_[i].size());
      if (!f.meta.empty()) add(f.meta.data(), f.meta.size());
      if (!f.pieces.empty())
        for (auto piece : f.pieces) add(piece.data(), piece.size());
      else if (f.payload_len)
        add(f.payload, f.payload_len);
    }
    wnext_ = 0;
    consume(wiov_, wnext_, skip);  // the bytes write_now already sent
    if (tls) {
      wbufs_.clear();
      for (std::size_t i = wnext_; i < wiov_.size(); ++i)
        wbufs_.emplace_back(wiov_[i].iov_base, wiov_[i].iov_len);
    }
    return true;
  }

  /// The gathered write, for TLS's async_write: unchanged until written().
  std::span<const boost::asio::const_buffer> tls_buffers() const { return wbufs_; }

  /// What send() did with the gathered write.
  struct send_result {
    bool done = false;  // all of it went
    int error = 0;      // else, an errno: the link failed; neither: no room, wait for it
  };
  /// Sends the gathered write's rest on the plain socket `fd`, in non-blocking sendmsg calls of
  /// up to IOV_MAX buffers each, until it all went, the socket is full, or it fails.
  send_result send(int fd) {
    while (wnext_ < wiov_.size()) {
      const socket_io_result r = send_some(fd, std::span(wiov_).subspan(wnext_));
      if (r.would_block) return {};
      if (r.error) return {false, r.error};
      consume(wiov_, wnext_, r.bytes);
    }
    return {true};
  }

  /// The gathered frames are on the wire: their bytes leave the queued count.
  void written() {
    std::size_t done = 0;
    for (auto& f : inflight_) done += frame_bytes(f);
    inflight_.clear();
    if (!closed_flag_.load()) queued_bytes_ -= done;
  }

  /// Drops what is queued; later frames are dropped as queued. Thread-safe.
  void close() {
    closed_flag_ = true;
    std::lock_guard lk(qm_);
    closed_ = true;
    queue_.clear();
    partial_.clear();
    queued_bytes_ = 0;
  }

  /// Bytes of frames queued and not yet taken by the socket.
  std::size_t queued_bytes() const noexcept { return queued_bytes_.load(); }

  /// Returns once no caller's thread is inside a direct write, ordered after the writes that
  /// finished (connection::sync_with_direct_writes says why).
  void sync_with_direct_writes() const noexcept {
    while (direct_writers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }

 private:
  static std::size_t frame_bytes(const out_frame& f) {
    return wire::header_size + f.meta.size() + f.payload_len;
  }

  // One non-blocking sendmsg of a whole frame from the calling thread (qm_ held, so no io-thread
  // write interleaves). Returns the bytes the socket took; 0 on EAGAIN or an error, which the io
  // thread's write of the rest then meets and reports.
  std::size_t write_now(int fd, const out_frame& f) {
    const auto hdr = wire::encode(f.h);
    iovec iov[3];
    int n = 0;
    auto add = [&](const void* p, std::size_t len) { iov[n++] = {const_cast<void*>(p), len}; };
    add(hdr.data(), hdr.size());
    if (!f.meta.empty()) add(f.meta.data(), f.meta.size());
    if (f.payload_len) add(f.payload, f.payload_len);
    direct_writers_.fetch_add(1, std::memory_order_relaxed);  // see sync_with_direct_writes
    const socket_io_result r =
        send_some(fd, std::span<const iovec>(iov, static_cast<std::size_t>(n)));
    direct_writers_.fetch_sub(1, std::memory_order_release);
    return r.bytes;
  }

  const std::size_t gather_bytes_;
  std::atomic<std::size_t> queued_bytes_{0};
  std::atomic<bool> closed_flag_{false};  // close() ran (read without qm_ by written())

  // The caller's thread queues frames and the io thread takes them: held briefly by both.
  detail::spin_mutex qm_;
  send_queue queue_;
  bool writing_ = false;
  bool closed_ = false;
  std::vector<out_frame> partial_;      // a frame the caller's thread sent in part (write_now)
  std::size_t partial_skip_ = 0;        // how much of it went
  std::atomic<int> direct_writers_{0};  // callers inside write_now's sendmsg (0 or 1: qm_ held)

  // The write in progress (io thread only).
  std::vector<out_frame> inflight_;
  std::vector<wire::header_bytes> hdrs_;
  std::vector<iovec> wiov_;                       // inflight_'s pieces
  std::size_t wnext_ = 0;                         // wiov_'s first buffer not yet sent whole
  std::vector<boost::asio::const_buffer> wbufs_;  // the rest of wiov_, as TLS's async_write takes
};

}  // namespace kvstore::transport
