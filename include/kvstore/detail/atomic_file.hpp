// Whole-file I/O for state that must survive crashes (optimizer states, server checkpoints):
// a file is either the old version or the new one, never a torn mix, and a checksum to tell a
// corrupt file from a good one.
#pragma once

#include <kvstore/error.hpp>

#include <boost/crc.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvstore::detail {

inline std::string errno_message(int err) { return std::strerror(err); }

/// A file descriptor closed on scope exit (errors on close of a read-only fd do not matter; the
/// writer closes explicitly and checks).
class unique_fd {
 public:
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }
  int get() const noexcept { return fd_; }
  /// Closes now and reports close()'s errno (0 on success): a failed close may mean lost data.
  int reset() noexcept {
    int err = 0;
    if (fd_ >= 0 && ::close(fd_) != 0) err = errno;
    fd_ = -1;
    return err;
  }

 private:
  int fd_;
};

[[noreturn]] inline void throw_io_error(std::string_view what, const std::filesystem::path& p,
                                        int err) {
  throw kvstore::error(errc::io_error,
                       std::string(what) + " '" + p.string() + "': " + errno_message(err));
}

/// Writes all of `bytes` to `fd`, retrying short writes and EINTR. Returns errno, 0 on success.
inline int write_all(int fd, const char* data, std::size_t n) noexcept {
  while (n > 0) {
    const ::ssize_t k = ::write(fd, data, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += k;
    n -= static_cast<std::size_t>(k);
  }
  return 0;
}

/// Replaces the file at `path` with `bytes` atomically and durably: writes a temporary file in
/// the same directory, fsyncs it, renames it over `path` and fsyncs the directory, so after a
/// crash the file holds either its old content or all of the new one. Throws
/// kvstore::error(io_error) naming the path and the system's reason (missing directory, no
/// permission, disk full...); on failure the temporary file is removed and `path` is untouched.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  // Unique among processes (pid) and threads (counter); O_EXCL guards against the rest.
  static std::atomic<unsigned> counter{0};
  // Keep the temporary name within NAME_MAX even for a long file name.
  const std::string base = path.filename().string().substr(0, 200);
  fs::path tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = dir / ("." + base + ".tmp." + std::to_string(::getpid()) + "." +
                 std::to_string(counter.fetch_add(1)));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt >= 100)) {
      const int err = errno;
      throw_io_error("cannot create a temporary file to write", path, err);
    }
  }
  unique_fd file(fd);
  auto fail = [&](std::string_view what, int err) {
    file.reset();
    ::unlink(tmp.c_str());
    throw_io_error(what, path, err);
  };
  if (int err = write_all(file.get(), bytes.data(), bytes.size())) fail("cannot write", err);
  if (::fsync(file.get()) != 0) fail("cannot fsync", errno);
  if (int err = file.reset()) fail("cannot close", err);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename a temporary file to", errno);
  // The rename is only durable once the directory entry is on disk.
  unique_fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.get() < 0) throw_io_error("cannot open the directory of", path, errno);
  if (::fsync(d.get()) != 0 && errno != EINVAL)  // some filesystems cannot fsync a directory
    throw_io_error("cannot fsync the directory of", path, errno);
}

/// Byte-span form of write_file_atomically.
inline void write_file_atomically(const std::filesystem::path& path,
                                  std::span<const std::byte> bytes) {
  write_file_atomically(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

/// The whole content of the regular file at `path`. Throws kvstore::error(io_error) naming the
/// path and the reason when it cannot be opened or read (missing, a directory, no permission).
/// The whole file. With `magic`, a file that does not start with it is not read further: only
/// its first magic.size() bytes are returned (so a caller's "wrong magic" error comes at once,
/// not after reading a large file of something else into memory).
inline std::string read_file(const std::filesystem::path& path, std::string_view magic = {}) {
  unique_fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0) throw_io_error("cannot open", path, errno);
  struct ::stat st {};
  if (::fstat(f.get(), &st) != 0) throw_io_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode))
    throw_io_error("cannot read", path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL);
  std::string out;
  char buf[1 << 16];
  auto read_some = [&](std::size_t most) {
    for (;;) {
      const ::ssize_t k = ::read(f.get(), buf, std::min(most, sizeof buf));
      if (k >= 0) return static_cast<std::size_t>(k);
      if (errno != EINTR) throw_io_error("cannot read", path, errno);
    }
  };
  while (out.size() < magic.size()) {
    const std::size_t k = read_some(magic.size() - out.size());
    if (k == 0) return out;
    out.append(buf, k);
  }
  if (out != magic) return out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  while (const std::size_t k = read_some(sizeof buf)) out.append(buf, k);
  return out;
}

/// CRC-32 (the zlib/PNG polynomial) of `bytes`: detects torn or bit-flipped files, not tampering.
inline std::uint32_t checksum(std::string_view bytes) noexcept {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

/// Byte-span form of checksum.
inline std::uint32_t checksum(std::span<const std::byte> bytes) noexcept {
  return checksum(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace kvstore::detail
