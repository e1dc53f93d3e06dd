// Non-blocking scatter/gather on a plain TCP socket's descriptor: what a connection's writes and
// its payload reads do themselves rather than through Asio, whose async_write hands each sendmsg
// at most 16 buffers and 64 KiB. Each call is one syscall (retried on EINTR) and says what it
// did: bytes moved, no room or no bytes now, the end of the stream, or an error.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <climits>

#include <algorithm>
#include <cstddef>
#include <span>

namespace kvstore::transport {

/// What one non-blocking sendmsg or recvmsg did.
struct socket_io_result {
  std::size_t bytes = 0;     // moved
  bool would_block = false;  // nothing moved: no room (send) or no bytes (receive) now
  bool eof = false;          // receive: the peer closed its end
  int error = 0;             // an errno other than EAGAIN: the link failed
};

/// Buffers one sendmsg passes at most.
inline constexpr std::size_t max_iovecs = IOV_MAX;

/// Sends from `bufs` (at most max_iovecs of them go) without blocking.
inline socket_io_result send_some(int fd, std::span<const iovec> bufs) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(bufs.data());
  msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(std::min(bufs.size(), max_iovecs));
  for (;;) {
    const ssize_t r = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return {static_cast<std::size_t>(r)};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {0, true};
    return {0, false, false, errno};
  }
}

/// Receives into `bufs`, in order, without blocking.
inline socket_io_result receive_some(int fd, std::span<iovec> bufs) {
  msghdr msg{};
  msg.msg_iov = bufs.data();
  msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(std::min(bufs.size(), max_iovecs));
  for (;;) {
    const ssize_t r = ::recvmsg(fd, &msg, MSG_DONTWAIT);
    if (r > 0) return {static_cast<std::size_t>(r)};
    if (r == 0) return {0, false, true};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {0, true};
    return {0, false, false, errno};
  }
}

/// Drops `n` sent bytes from the front of bufs[next...]: whole buffers (next moves past them,
/// and past empty ones), then the front of a partly sent one.
inline void consume(std::span<iovec> bufs, std::size_t& next, std::size_t n) {
  while (next < bufs.size() && n >= bufs[next].iov_len) n -= bufs[next++].iov_len;
  if (n) {
    bufs[next].iov_base = static_cast<char*>(bufs[next].iov_base) + n;
    bufs[next].iov_len -= n;
  }
}

}  // namespace kvstore::transport
