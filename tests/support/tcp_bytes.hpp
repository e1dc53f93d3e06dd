// Bytes that crossed the wire, as the kernel counts them: the sum over this process's TCP
// sockets of TCP_INFO's tcpi_bytes_received (Linux 4.1+). For tests and benchmarks that check
// what compression saves; not a count of anything kvstore itself reports.
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

/// Sum of tcpi_bytes_received over the TCP sockets open in this process now (0 where the
/// kernel does not report it). Sockets closed since an earlier call no longer count.
inline std::uint64_t tcp_bytes_received() {
  // The kernel's struct tcp_info (linux/tcp.h, append-only UAPI) has tcpi_bytes_received at
  // byte 128; glibc's <netinet/tcp.h> stops before it, and the two headers cannot be mixed.
  constexpr std::size_t bytes_received_at = 128;
  std::uint64_t sum = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return 0;
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
    std::memcpy(&v, info + bytes_received_at, sizeof v);
    sum += v;
  }
  ::closedir(d);
  return sum;
}

}  // namespace kvtest
