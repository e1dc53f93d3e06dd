// Child processes for the tests: spawn with an exact environment and redirected output, a bounded
// wait that kills what does not end in time, a guard that kills and reaps whatever is left, a
// temporary directory removed afterwards, a free scheduler port and a file reader. Independent
// of doctest (failures throw std::runtime_error), so drivers like kv_soak use it too.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

extern char** environ;

namespace kvtest {

namespace fs = std::filesystem;

/// This process's environment, as NAME=value strings.
inline std::vector<std::string> environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

/// This process's environment without KVSTORE_* and DMLC_*: the start of a child's environment
/// whose role and job the test sets, so nothing from the caller's shell leaks into it.
inline std::vector<std::string> clean_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "KVSTORE_", 8) != 0 && std::strncmp(*e, "DMLC_", 5) != 0)
      env.emplace_back(*e);
  return env;
}

/// Polls pred every 20 ms until it holds or `limit` has passed; returns its last value.
template <class P>
bool wait_until(P pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

/// A child process, killed (SIGCONT first, in case it is stopped, then SIGKILL) and reaped when
/// the guard goes out of scope, also by an exception.
class child {
 public:
  child() = default;
  explicit child(pid_t pid) : pid_(pid) {}
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  child(child&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  child& operator=(child&& o) noexcept {
    if (this != &o) {
      kill();
      pid_ = o.pid_;
      o.pid_ = -1;
    }
    return *this;
  }
  ~child() { kill(); }

  /// The process id; -1 once it has been reaped.
  pid_t pid() const noexcept { return pid_; }

  /// Sends `sig` (while it runs).
  void signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  /// Kills and reaps it now (nothing if it was reaped already).
  void kill() noexcept {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  /// Its exit code, 128 + the signal that ended it, or -1 when it did not end within `limit`
  /// (then it is killed); -2 if it was reaped before.
  int wait_exit(std::chrono::milliseconds limit) {
    if (pid_ <= 0) return -2;
    const auto end = std::chrono::steady_clock::now() + limit;
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() >= end) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill();
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

/// Whether spawn truncates the output files or appends to them.
enum class open_mode { truncate, append };

/// Starts argv (argv[0] searched on PATH when it has no '/') with exactly the environment `env`
/// (environment(), clean_environment(), plus what the child needs), its stdout into the file
/// `out` and its stderr into `err` (empty: inherited; err == out: one file for both). Throws
/// std::runtime_error when it cannot be started.
inline child spawn(std::vector<std::string> argv, std::vector<std::string> env,
                   const std::string& out = {}, const std::string& err = {},
                   open_mode mode = open_mode::truncate) {
  if (argv.empty()) throw std::runtime_error("spawn: no program");
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  for (auto& s : env) e.push_back(s.data());
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  // O_APPEND: several processes may share one log.
  const int flags = O_WRONLY | O_CREAT | O_APPEND | (mode == open_mode::append ? 0 : O_TRUNC);
  if (!out.empty()) posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), flags, 0644);
  if (!err.empty() && err == out)
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  else if (!err.empty())
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), flags, 0644);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, a[0], &fa, nullptr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  return child(pid);
}

/// A fresh directory under the system's temporary directory, removed with all it holds.
class temp_dir {
 public:
  explicit temp_dir(std::string_view prefix = "kvtest") {
    std::string t = (fs::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (!::mkdtemp(t.data()))
      throw std::runtime_error("mkdtemp " + t + ": " + std::strerror(errno));
    path_ = t;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const noexcept { return path_; }
  /// The path of `name` in it, as a string (what spawn and the options structs take).
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

/// The whole file, or "" when it cannot be read.
inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// A free TCP port on 127.0.0.1 for a scheduler process, which needs its port up front (a
/// scheduler thread binds port 0 instead). Picked at random BELOW the kernel's ephemeral range
/// (usually from 32768): a port the kernel hands out for port 0 can become some outgoing
/// connection's local port before the scheduler binds it, which happened under parallel ctest.
inline std::uint16_t free_port() {
  static std::mt19937 rng(
      static_cast<unsigned>(::getpid()) ^
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int i = 0; i < 64; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(20000 + rng() % 12000));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return ntohs(a.sin_port);
  }
  throw std::runtime_error("no free port on 127.0.0.1 between 20000 and 32000");
}

}  // namespace kvtest
