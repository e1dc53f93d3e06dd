// kv_launch: start a whole kvstore cluster on this machine.
//
//   kv_launch -w W -s S [options] [--] PROGRAM ARGS...
//   kv_launch -w W --colocated [options] [--] PROGRAM ARGS...
//
// Starts one scheduler and S servers (the kv_server binary) and W copies of PROGRAM, each with the
// KVSTORE_* environment that tells it its role and where the scheduler listens. Every line a child
// writes is echoed with a "[role rank] " prefix. Signals are forwarded, stragglers are terminated
// after a grace period, and the exit code is that of the first process that failed. With
// --colocated no server process starts: every worker serves one shard itself (KVSTORE_COLOCATED=1,
// as many servers as workers).
//
// Deliberately standalone (plain C++20 + POSIX and Boost.Program_options for the command line, no
// kvstore headers) so that it builds and works even when the library does not, and so that it
// cannot be affected by the processes it supervises.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace {

namespace po = boost::program_options;
using clock_type = std::chrono::steady_clock;
using time_point = clock_type::time_point;

constexpr int exit_usage = 2;
constexpr int exit_timeout = 124;
constexpr int exit_cannot_start = 127;
// After SIGTERM, how long a process gets before SIGKILL.
constexpr auto kill_delay = std::chrono::seconds(3);
// A line longer than this is echoed in pieces so that one chatty child cannot exhaust memory.
constexpr std::size_t max_line = 64 * 1024;

constexpr std::string_view usage_head =
    "usage: kv_launch -w W -s S [options] [--] PROGRAM ARGS...\n"
    "       kv_launch -w W --colocated [options] [--] PROGRAM ARGS...\n"
    "\n"
    "Starts a kvstore cluster on 127.0.0.1: one scheduler and S servers (kv_server) and W copies\n"
    "of PROGRAM, prefixing every line of their output with the role and rank. With --colocated\n"
    "every worker serves one shard itself: W servers, no server processes.\n";

constexpr std::string_view usage_tail =
    "\n"
    "Every child gets KVSTORE_SCHEDULER, KVSTORE_NUM_WORKERS, KVSTORE_NUM_SERVERS, KVSTORE_ROLE "
    "and\n"
    "KVSTORE_RANK (plus KVSTORE_TYPE with --type, KVSTORE_COLOCATED=1 with --colocated); the\n"
    "rest of the environment, KVSTORE_TOKEN\n"
    "included, is inherited. stdin of every child is /dev/null.\n"
    "SIGINT, SIGTERM and SIGHUP are forwarded to all children; a third one sends SIGKILL.\n"
    "Exit code: 0 if every process exited with 0, 124 on --timeout, 128+N after signal N, else\n"
    "the first failure's code (128+N for a process killed by signal N; a process kv_launch had\n"
    "to terminate counts as failed).\n";

// ---------------------------------------------------------------------------------------------
// Small I/O helpers

// Writes everything, retrying on EINTR and waiting out EAGAIN (stdout may be inherited
// non-blocking). Gives up silently on other errors: a closed stdout must not stop supervision.
void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return;
    }
  }
}

void message(std::string_view text) {
  std::string line = "kv_launch: ";
  line += text;
  line += '\n';
  write_all(STDERR_FILENO, line);
}

std::string errno_text(int err) { return std::strerror(err); }

// ---------------------------------------------------------------------------------------------
// Options

struct options {
  int workers = 0;
  int servers = 0;
  bool colocated = false;  // every worker serves a shard: servers = workers, no server processes
  int port = 0;            // 0: pick a free one
  std::string server_path;
  std::string type;
  double grace_s = 15;
  double timeout_s = 0;  // 0: none
  std::vector<std::string> program;
};

// The options, as Boost.Program_options describes and checks them (types, ranges, --help).
po::options_description describe(options& opt) {
  po::options_description d("options", 100);
  // clang-format off
  d.add_options()
      ("workers,w", kvtool::ranged(&opt.workers, 1, 4096)->value_name("W")->required(),
       "number of workers (copies of PROGRAM), at least 1")
      ("servers,s", kvtool::ranged(&opt.servers, 1, 4096)->value_name("S"),
       "number of servers, at least 1 (required without --colocated)")
      ("colocated", po::bool_switch(&opt.colocated),
       "every worker also serves one shard (KVSTORE_COLOCATED=1): W servers, no server processes")
      ("port,p", kvtool::ranged(&opt.port, 1, 65535)->value_name("P"),
       "scheduler port (default: a free port picked at start)")
      ("server", po::value(&opt.server_path)->value_name("PATH"),
       "kv_server binary (default: $KVSTORE_SERVER_BIN, else kv_server next to kv_launch, else "
       "kv_server on PATH)")
      ("type", po::value(&opt.type)->value_name("T"),
       "sets KVSTORE_TYPE: dist_sync or dist_async (default: inherited)")
      ("grace", kvtool::ranged(&opt.grace_s, 0.0, 1e7)->value_name("SECONDS"),
       "how long the servers and scheduler get to exit after the last worker, or everyone after a "
       "failure, before SIGTERM (default 15)")
      ("timeout", kvtool::ranged(&opt.timeout_s, 0.0, 1e7)->value_name("SECONDS"),
       "terminate everything after this long and exit 124 (default: none)")
      ("help,h", "show this help");
  // clang-format on
  return d;
}

// PROGRAM and its arguments: everything from the first argument that is not an option (or after
// "--"), so that PROGRAM's own options (sh -c, ls -l) are never taken for ours.
std::vector<po::option> program_and_args(std::vector<std::string>& args) {
  std::vector<po::option> out;
  if (args.empty()) return out;
  const std::string& first = args[0];
  const bool dashes = first == "--";
  if (!dashes && first.size() > 1 && first[0] == '-') return out;  // an option: Boost's to parse
  po::option o;
  o.string_key = "program";
  o.value.assign(args.begin() + (dashes ? 1 : 0), args.end());
  o.original_tokens = args;
  args.clear();
  if (!o.value.empty()) out.push_back(std::move(o));
  return out;
}

// Parses the command line; nullopt after --help (printed); throws po::error on bad usage.
std::optional<options> parse_args(int argc, char** argv, std::string& help) {
  options opt;
  auto visible = describe(opt);
  std::ostringstream text;
  text << usage_head << "\n" << visible << usage_tail;
  help = text.str();
  po::options_description all;
  all.add(visible).add_options()("program", po::value(&opt.program)->multitoken());
  po::variables_map vm;
  po::store(
      po::command_line_parser(argc, argv).options(all).extra_style_parser(program_and_args).run(),
      vm);
  if (vm.count("help")) return std::nullopt;
  po::notify(vm);
  if (opt.type.size() && opt.type != "dist_sync" && opt.type != "dist_async")
    throw po::error("--type must be dist_sync or dist_async, got '" + opt.type + "'");
  if (vm.count("server") && opt.server_path.empty()) throw po::error("--server needs a path");
  if (vm.count("timeout") && opt.timeout_s <= 0) throw po::error("--timeout must be positive");
  if (opt.program.empty()) throw po::error("no PROGRAM given to run as the workers");
  if (!opt.colocated && !vm.count("servers"))
    throw po::error("the option '--servers' is required but missing");
  if (opt.colocated && vm.count("servers") && opt.servers != opt.workers)
    throw po::error("--colocated runs one server in each worker: -s " +
                    std::to_string(opt.servers) + " differs from -w " +
                    std::to_string(opt.workers));
  if (opt.colocated) opt.servers = opt.workers;
  return opt;
}

// ---------------------------------------------------------------------------------------------
// Finding kv_server and a port

bool is_executable_file(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

std::string self_directory() {
  std::string buf(4096, '\0');
  ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return {};
  buf.resize(static_cast<std::size_t>(n));
  auto slash = buf.rfind('/');
  return slash == std::string::npos ? std::string{} : buf.substr(0, slash);
}

// An explicit choice (--server, then the environment) beats the kv_server built beside us, so
// that tests and users can substitute their own server even in a build tree that has one.
std::string find_server(const options& opt) {
  if (!opt.server_path.empty()) return opt.server_path;
  if (const char* env = std::getenv("KVSTORE_SERVER_BIN"); env && *env) return env;
  if (auto dir = self_directory(); !dir.empty()) {
    std::string beside = dir + "/kv_server";
    if (is_executable_file(beside)) return beside;
  }
  return "kv_server";  // searched on PATH by posix_spawnp
}

// A port on loopback that binds now, chosen at random BELOW the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range, usually from 32768): a port the kernel hands out
// (bind to port 0) may become the local port of some outgoing connection before the scheduler
// binds it, which happened under parallel tests. Falls back to the kernel's choice.
std::optional<int> pick_free_port(std::string& error) {
  auto try_bind = [&](int want) -> std::optional<int> {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = "socket: " + errno_text(errno);
      return std::nullopt;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(want));
    socklen_t len = sizeof addr;
    std::optional<int> port;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      error = "bind 127.0.0.1:" + std::to_string(want) + ": " + errno_text(errno);
    else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      error = "getsockname: " + errno_text(errno);
    else
      port = ntohs(addr.sin_port);
    ::close(fd);
    return port;
  };
  std::mt19937 rng(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(::time(nullptr)));
  for (int i = 0; i < 64; ++i)
    if (auto p = try_bind(20000 + static_cast<int>(rng() % 12000))) return p;
  return try_bind(0);
}

// ---------------------------------------------------------------------------------------------
// Children

// One of a child's output pipes: bytes are collected until a newline, then echoed as one write.
struct stream {
  int fd = -1;      // read end, -1 once closed
  int out_fd = -1;  // where the prefixed lines go (our stdout or stderr)
  std::string pending;
};

struct child {
  std::string label;  // "scheduler", "server 0", "worker 1"
  bool is_worker = false;
  pid_t pid = -1;  // -1 if it never started
  bool running = false;
  int status = 0;  // wait status once reaped
  stream out, err;
};

void echo_line(const child& c, const stream& s, std::string_view text) {
  std::string line;
  line.reserve(c.label.size() + text.size() + 4);
  line += '[';
  line += c.label;
  line += "] ";
  line += text;
  line += '\n';
  write_all(s.out_fd, line);
}

void echo_complete_lines(const child& c, stream& s) {
  std::size_t start = 0;
  for (;;) {
    auto nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    echo_line(c, s, std::string_view(s.pending).substr(start, nl - start));
    start = nl + 1;
  }
  s.pending.erase(0, start);
  while (s.pending.size() >= max_line) {
    echo_line(c, s, std::string_view(s.pending).substr(0, max_line));
    s.pending.erase(0, max_line);
  }
}

void close_stream(const child& c, stream& s) {
  if (!s.pending.empty()) {
    echo_line(c, s, s.pending);  // a last line without its newline
    s.pending.clear();
  }
  if (s.fd >= 0) ::close(s.fd);
  s.fd = -1;
}

// Reads what is available now. Returns false at end of file (or a read error), when the stream
// should be closed.
bool read_stream(const child& c, stream& s) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.pending.append(buf, static_cast<std::size_t>(n));
      echo_complete_lines(c, s);
      if (static_cast<std::size_t>(n) < sizeof buf) return true;
    } else if (n == 0) {
      return false;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return true;
    } else {
      return false;
    }
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    std::string text = "killed by signal " + std::to_string(sig);
    if (const char* name = sigabbrev_np(sig)) text += std::string(" (SIG") + name + ")";
    return text;
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

struct pipe_pair {
  int read_end = -1, write_end = -1;
};

std::optional<pipe_pair> make_pipe(std::string& error) {
  int fds[2];
  // O_CLOEXEC so that no child inherits another child's pipes; the child gets its own write
  // end through dup2 in the spawn file actions, which clears the flag on the copy.
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    error = "pipe: " + errno_text(errno);
    return std::nullopt;
  }
  // Non-blocking read ends: the loop drains whatever is there without ever stalling on one child.
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return pipe_pair{fds[0], fds[1]};
}

// Environment variables kv_launch owns. Inherited copies are dropped so a stale value from the
// caller's shell cannot contradict ours; the DMLC_* aliases go too, for the same reason.
bool is_overridden(std::string_view entry, bool override_type) {
  static constexpr std::string_view owned[] = {
      "KVSTORE_SCHEDULER", "KVSTORE_NUM_WORKERS", "KVSTORE_NUM_SERVERS", "KVSTORE_ROLE",
      "KVSTORE_RANK",      "DMLC_ROLE",           "DMLC_PS_ROOT_URI",    "DMLC_PS_ROOT_PORT",
      "DMLC_NUM_WORKER",   "DMLC_NUM_SERVER",     "KVSTORE_COLOCATED"};
  auto eq = entry.find('=');
  std::string_view name = entry.substr(0, eq);
  if (override_type && name == "KVSTORE_TYPE") return true;
  return std::find(std::begin(owned), std::end(owned), name) != std::end(owned);
}

std::vector<std::string> child_environment(const options& opt, int port, std::string_view role,
                                           int rank) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (!is_overridden(*e, !opt.type.empty())) env.emplace_back(*e);
  env.push_back("KVSTORE_SCHEDULER=127.0.0.1:" + std::to_string(port));
  env.push_back("KVSTORE_NUM_WORKERS=" + std::to_string(opt.workers));
  env.push_back("KVSTORE_NUM_SERVERS=" + std::to_string(opt.servers));
  env.push_back("KVSTORE_ROLE=" + std::string(role));
  if (rank >= 0) env.push_back("KVSTORE_RANK=" + std::to_string(rank));
  if (!opt.type.empty()) env.push_back("KVSTORE_TYPE=" + opt.type);
  if (opt.colocated) env.push_back("KVSTORE_COLOCATED=1");
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Starts one child with stdin from /dev/null, stdout and stderr into fresh pipes, in its own
// process group (so a terminal's Ctrl-C reaches only kv_launch, which forwards it exactly once)
// and with default signal dispositions. Returns an error text on failure.
std::string spawn_child(child& c, std::vector<std::string> argv_strings,
                        std::vector<std::string> env_strings, int stdout_fd, int stderr_fd) {
  std::string error;
  auto out = make_pipe(error);
  if (!out) return error;
  auto err = make_pipe(error);
  if (!err) {
    ::close(out->read_end);
    ::close(out->write_end);
    return error;
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out->write_end, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err->write_end, STDERR_FILENO);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // Our own descriptors are all close-on-exec; this also keeps out anything kv_launch itself
  // inherited without the flag, so every child starts with exactly 0, 1 and 2.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif

  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  auto argv = c_strings(argv_strings);
  auto envp = c_strings(env_strings);
  pid_t pid = -1;
  int rc = argv_strings[0].find('/') == std::string::npos
               ? ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data())
               : ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  // The write ends belong to the child now; keeping ours would hide its end of file.
  ::close(out->write_end);
  ::close(err->write_end);
  if (rc != 0) {
    ::close(out->read_end);
    ::close(err->read_end);
    return argv_strings[0] + ": " + errno_text(rc);
  }
  c.pid = pid;
  c.running = true;
  c.out = stream{out->read_end, stdout_fd, {}};
  c.err = stream{err->read_end, stderr_fd, {}};
  return {};
}

// ---------------------------------------------------------------------------------------------
// Signals: the handler only writes the signal number into a pipe that the poll loop watches.

int signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(signal_pipe[1], &byte, 1);
  errno = saved;
}

bool install_signal_handlers(std::string& error) {
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    error = "pipe: " + errno_text(errno);
    return false;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(sig, &sa, nullptr);
  // A reader of our output going away must not kill the supervisor and orphan the cluster.
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}

// Makes sure descriptors 0-2 exist, so that no pipe we create lands on one of them and gets
// confused with a standard stream.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) {
        ::dup2(null_fd, fd);
        ::close(null_fd);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Supervision

class launcher {
 public:
  launcher(options opt) : opt_(std::move(opt)) {}

  int run() {
    std::string error;
    int port = 0;
    if (opt_.port) {
      port = opt_.port;
    } else if (auto picked = pick_free_port(error)) {
      port = *picked;
    } else {
      message("cannot pick a free port: " + error);
      return 1;
    }
    if (!install_signal_handlers(error)) {
      message(error);
      return 1;
    }
    start_ = clock_type::now();
    if (opt_.timeout_s > 0) timeout_at_ = start_ + to_duration(opt_.timeout_s);
    start_all(port);
    loop();
    drain_and_close_all();
    return exit_code();
  }

 private:
  static clock_type::duration to_duration(double seconds) {
    return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  }

  // The scheduler first, then the servers, then the workers: the order in which they are needed.
  void start_all(int port) {
    std::string server = find_server(opt_);
    children_.reserve(1 + opt_.servers + opt_.workers);
    auto add = [&](std::string label, bool is_worker, std::vector<std::string> argv,
                   std::string_view role, int rank) {
      children_.push_back(child{});
      child& c = children_.back();
      c.label = std::move(label);
      c.is_worker = is_worker;
      // Once one process cannot start the cluster cannot form; the rest are not started.
      if (failed_) return;
      auto env = child_environment(opt_, port, role, rank);
      if (auto err = spawn_child(c, std::move(argv), std::move(env), STDOUT_FILENO, STDERR_FILENO);
          !err.empty()) {
        message("cannot start " + c.label + ": " + err);
        record_failure(exit_cannot_start);
        terminate_at_ = clock_type::now();  // nothing to wait for: terminate at once
      }
    };
    add("scheduler", false, {server, "--role", "scheduler"}, "scheduler", -1);
    for (int i = 0; i < opt_.servers && !opt_.colocated; ++i)
      add("server " + std::to_string(i), false, {server, "--role", "server"}, "server", i);
    for (int i = 0; i < opt_.workers; ++i)
      add("worker " + std::to_string(i), true, opt_.program, "worker", i);
  }

  void record_failure(int code) {
    if (!failed_) first_failure_ = code;
    failed_ = true;
  }

  void shorten_terminate_deadline(time_point when) {
    if (!terminate_at_ || when < *terminate_at_) terminate_at_ = when;
  }

  bool any_running() const {
    return std::any_of(children_.begin(), children_.end(),
                       [](const child& c) { return c.running; });
  }
  bool workers_running() const {
    return std::any_of(children_.begin(), children_.end(),
                       [](const child& c) { return c.running && c.is_worker; });
  }

  // Each child leads its own process group, so signalling the group also reaches whatever it
  // started itself (a shell's commands, for instance).
  void signal_all(int sig) {
    for (auto& c : children_)
      if (c.running && ::kill(-c.pid, sig) != 0) ::kill(c.pid, sig);
  }

  std::string running_labels() const {
    std::string text;
    for (const auto& c : children_)
      if (c.running) text += (text.empty() ? "" : ", ") + c.label;
    return text;
  }

  void reap() {
    for (auto& c : children_) {
      if (!c.running) continue;
      int status = 0;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      c.running = false;
      if (r < 0) {  // cannot happen for our own child; treat it as a failure rather than hang
        message(c.label + ": waitpid: " + errno_text(errno));
        record_failure(1);
        continue;
      }
      c.status = status;
      // Echo what it wrote before its exit report, so the report comes after its last words.
      drain(c);
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        message(c.label + " " + describe_status(status));
        // Failures after an interrupt or a timeout are consequences of it, not causes.
        if (!interrupt_signal_ && !timed_out_) record_failure(exit_code_of(status));
        // The others should notice on their own (connection errors, deadlines); give them the
        // grace period to say so before they are terminated.
        shorten_terminate_deadline(clock_type::now() + to_duration(opt_.grace_s));
      }
    }
    if (!workers_announced_done_ && !workers_running() && any_running()) {
      workers_announced_done_ = true;
      shorten_terminate_deadline(clock_type::now() + to_duration(opt_.grace_s));
    }
  }

  void drain(child& c) {
    for (stream* s : {&c.out, &c.err})
      if (s->fd >= 0 && !read_stream(c, *s)) close_stream(c, *s);
  }

  void drain_and_close_all() {
    for (auto& c : children_) {
      drain(c);
      close_stream(c, c.out);
      close_stream(c, c.err);
    }
  }

  void handle_signals() {
    unsigned char buf[64];
    for (;;) {
      ssize_t n = ::read(signal_pipe[0], buf, sizeof buf);
      if (n <= 0) break;  // EAGAIN: all read
      for (ssize_t k = 0; k < n; ++k) {
        int sig = buf[k];
        if (sig == SIGCHLD) continue;  // reap() runs every iteration anyway
        if (!interrupt_signal_) interrupt_signal_ = sig;
        ++interrupts_;
        if (interrupts_ >= 3) {
          message(std::string("received SIG") + sigabbrev_np(sig) +
                  " again; killing all processes");
          signal_all(SIGKILL);
        } else {
          message(std::string("received SIG") + sigabbrev_np(sig) + "; forwarding it to " +
                  (any_running() ? running_labels() : "no one (all exited)"));
          signal_all(sig);
          shorten_terminate_deadline(clock_type::now() + to_duration(opt_.grace_s));
        }
      }
    }
  }

  void handle_deadlines() {
    if (!any_running()) return;
    auto now = clock_type::now();
    if (timeout_at_ && now >= *timeout_at_ && !timed_out_) {
      timed_out_ = true;
      message("timed out after " + format_seconds(opt_.timeout_s) + " s; terminating " +
              running_labels());
      begin_termination(now);
    }
    if (terminate_at_ && now >= *terminate_at_ && !terminating_) {
      if (failed_)
        message("terminating " + running_labels() + " after a failure");
      else if (interrupt_signal_)
        message("terminating " + running_labels() + ", still running " +
                format_seconds(opt_.grace_s) + " s after the forwarded signal");
      else
        message(running_labels() + " still running " + format_seconds(opt_.grace_s) +
                " s after the last worker exited; terminating");
      begin_termination(now);
    }
    if (kill_at_ && now >= *kill_at_) {
      message("killing " + running_labels() + ", still running 3 s after SIGTERM");
      signal_all(SIGKILL);
      kill_at_.reset();
    }
  }

  void begin_termination(time_point now) {
    if (terminating_) return;
    terminating_ = true;
    signal_all(SIGTERM);
    kill_at_ = now + kill_delay;
  }

  static std::string format_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
  }

  int poll_timeout_ms() const {
    std::optional<time_point> next;
    auto consider = [&](const std::optional<time_point>& t) {
      if (t && (!next || *t < *next)) next = t;
    };
    if (!timed_out_) consider(timeout_at_);
    if (!terminating_) consider(terminate_at_);
    consider(kill_at_);
    if (!next) return -1;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - clock_type::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<std::pair<child*, stream*>> owners;
    for (;;) {
      reap();
      handle_deadlines();
      if (!any_running()) return;

      fds.clear();
      owners.clear();
      fds.push_back({signal_pipe[0], POLLIN, 0});
      owners.emplace_back(nullptr, nullptr);
      for (auto& c : children_)
        for (stream* s : {&c.out, &c.err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            owners.emplace_back(&c, s);
          }
      int n = ::poll(fds.data(), fds.size(), poll_timeout_ms());
      if (n < 0) {
        if (errno == EINTR) continue;
        message("poll: " + errno_text(errno));
        signal_all(SIGKILL);
        record_failure(1);
        return;
      }
      if (fds[0].revents) handle_signals();
      for (std::size_t k = 1; k < fds.size(); ++k) {
        if (!fds[k].revents) continue;
        auto [c, s] = owners[k];
        if (!read_stream(*c, *s)) close_stream(*c, *s);
      }
    }
  }

  int exit_code() const {
    if (timed_out_) return exit_timeout;
    if (failed_) return first_failure_;
    if (interrupt_signal_) return 128 + interrupt_signal_;
    return 0;
  }

  options opt_;
  std::vector<child> children_;
  time_point start_;
  std::optional<time_point> timeout_at_, terminate_at_, kill_at_;
  bool timed_out_ = false, terminating_ = false, failed_ = false, workers_announced_done_ = false;
  int first_failure_ = 0;
  int interrupt_signal_ = 0;
  int interrupts_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_fds();
  std::string help;
  std::optional<options> opt;
  try {
    opt = parse_args(argc, argv, help);
  } catch (const po::error& e) {
    message(e.what());
    write_all(STDERR_FILENO, help);
    return exit_usage;
  }
  if (!opt) {
    write_all(STDOUT_FILENO, help);
    return 0;
  }
  return launcher(std::move(*opt)).run();
}
