// Bytes that crossed the wire, as the kernel counts them: sums over this process's TCP sockets
// of TCP_INFO's tcpi_bytes_acked and tcpi_bytes_received (Linux 4.1+). For tests and benchmarks
// that check what compression saves; not a count of anything kvstore itself reports.
#pragma once

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace kvtest {

/// Bytes this process's TCP sockets open now have sent (and had acknowledged) and received, as
/// sums (0 where the kernel does not report them). Sockets closed since an earlier call no longer
/// count.
struct tcp_traffic {
  std::uint64_t sent = 0, received = 0;
};
inline tcp_traffic tcp_bytes() {
  // The kernel's struct tcp_info (linux/tcp.h, append-only UAPI) has tcpi_bytes_acked at byte
  // 120 and tcpi_bytes_received at 128; glibc's <netinet/tcp.h> stops before them, and the two
  // headers cannot be mixed.
  constexpr std::size_t bytes_acked_at = 120, bytes_received_at = 128;
  tcp_traffic sum;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return sum;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end) continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    unsigned char info[256] = {};
    socklen_t len = sizeof info;
    if (::getsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_INFO, info, &len) != 0 ||
        len < bytes_received_at + 8)
      continue;
    std::uint64_t v;
    std::memcpy(&v, info + bytes_acked_at, sizeof v);
    sum.sent += v;
    std::memcpy(&v, info + bytes_received_at, sizeof v);
    sum.received += v;
  }
  ::closedir(d);
  return sum;
}

/// Bytes received by this process's TCP sockets (tcp_bytes().received).
inline std::uint64_t tcp_bytes_received() { return tcp_bytes().received; }

}  // namespace kvtest
