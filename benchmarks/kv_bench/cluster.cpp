// The bodies of cluster.hpp: forking and reaping the children, the kvstore cluster's options,
// and the parent's loop that releases the two groups in turn and parses their sample lines.
#include "cluster.hpp"

#include "raw_baseline.hpp"

#include <kvstore/serve.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace kv_bench {

namespace {

std::vector<pid_t> children;
// The kvstore server processes of the running setup (none when colocated): the workers, forked
// after them, read their CPU time.
std::vector<pid_t> kv_servers;

// Forks a child running f(write end of a pipe to the parent); returns the read end.
template <class F>
int spawn(F&& f) {
  int p[2];
  if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(p[0]);
    int rc = 0;
    try {
      rc = f(p[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kv_bench child: %s\n", e.what());
      write_all(p[1], std::string("E ") + e.what() + "\n");
      rc = 3;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  ::close(p[1]);
  children.push_back(pid);
  return p[0];
}

// Waits for every child; true when all exited with status 0 within the limit (the rest killed).
bool reap_children(std::chrono::seconds limit) {
  const auto deadline = clk::now() + limit;
  bool ok = true;
  std::vector<pid_t> left = children;
  while (!left.empty() && clk::now() < deadline) {
    for (auto it = left.begin(); it != left.end();) {
      int st = 0;
      pid_t r = ::waitpid(*it, &st, WNOHANG);
      if (r == *it) {
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
          std::fprintf(stderr, "kv_bench: child %d ended with %s %d\n", static_cast<int>(*it),
                       WIFEXITED(st) ? "status" : "signal",
                       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
          ok = false;
        }
        it = left.erase(it);
      } else {
        ++it;
      }
    }
    if (!left.empty()) ::usleep(10'000);
  }
  if (!left.empty()) {
    std::fprintf(stderr, "kv_bench: %zu children did not end in time; killed\n", left.size());
    ok = false;
  }
  kill_children();
  return ok;
}

// Reads one line from fd (blocking, bounded).
std::string read_line(int fd, std::chrono::seconds limit) {
  std::string s;
  const auto deadline = clk::now() + limit;
  while (clk::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char c;
    ssize_t n = ::read(fd, &c, 1);
    if (n <= 0) break;
    if (c == '\n') return s;
    s += c;
  }
  throw std::runtime_error("no answer from a child process (read \"" + s + "\")");
}

kvstore::dist_options cluster_options(int workers, int servers) {
  kvstore::dist_options o;
  o.scheduler_host = "127.0.0.1";
  o.scheduler_port = 0;
  o.num_workers = workers;
  o.num_servers = servers;
  o.sync = true;
  o.connect_timeout = std::chrono::milliseconds(30'000);
  o.request_timeout = std::chrono::milliseconds(60'000);
  o.barrier_timeout = std::chrono::milliseconds(60'000);
  o.dead_timeout = std::chrono::milliseconds(30'000);
  // KVSTORE_WAIT_SPIN_US=0 measures waits that sleep at once (see dist_options::wait_spin).
  if (const char* v = std::getenv("KVSTORE_WAIT_SPIN_US"))
    o.wait_spin = std::chrono::microseconds(std::atoi(v));
  // KVSTORE_SERVER_THREADS=1 measures servers that apply updates on their io thread alone.
  if (const char* v = std::getenv("KVSTORE_SERVER_THREADS"))
    o.server_threads = static_cast<unsigned>(std::atoi(v));
  // KVSTORE_FUSE_BYTES=0 measures one-key pushes without small-key fusion (on by default).
  if (const char* v = std::getenv("KVSTORE_FUSE_BYTES"))
    o.fuse_bytes = static_cast<std::size_t>(std::atoll(v));
  // KVSTORE_PIPELINE_DEPTH=1 measures ops of one key that each wait for the previous answer.
  if (const char* v = std::getenv("KVSTORE_PIPELINE_DEPTH"))
    o.pipeline_depth = static_cast<std::uint32_t>(std::max(1, std::atoi(v)));
  o.tcp_congestion = congestion_option();
  return o;
}

}  // namespace

void kill_children() {
  for (pid_t p : children) ::kill(p, SIGKILL);
  for (pid_t p : children) ::waitpid(p, nullptr, 0);
  children.clear();
}

double servers_cpu() {
  double sum = 0;
  for (pid_t p : kv_servers) {
    clockid_t c;
    timespec t{};
    if (::clock_getcpuclockid(p, &c) == 0 && ::clock_gettime(c, &t) == 0)
      sum += double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
  }
  return sum;
}

bool run_setup(const config& cfg, const setup_plan& p, std::vector<sample>& kv_out,
               std::vector<sample>& base_out) {
  const int W = p.W, S = p.S;
  auto o = cluster_options(W, S);
  o.colocated = p.colocated;
  kv_servers.clear();
  if (p.with_kv) {
    // kvstore::node_loop is the scheduler or the server of its options' role, declared only
    // here: their bodies are compiled once, in kv_bench_kvstore.
    int sched_fd = spawn([&](int fd) {
      auto so = o;
      so.role = kvstore::role::scheduler;
      kvstore::node_loop s(so);
      write_all(fd, "P " + std::to_string(s.port()) + "\n");
      s.run();
      return 0;
    });
    std::string line = read_line(sched_fd, std::chrono::seconds(20));
    ::close(sched_fd);
    if (line.rfind("P ", 0) != 0) throw std::runtime_error("scheduler did not start: " + line);
    o.scheduler_port = static_cast<std::uint16_t>(std::stoi(line.substr(2)));
    for (int s = 0; s < S && !p.colocated; ++s) {
      ::close(spawn([&](int) {
        auto so = o;
        so.role = kvstore::role::server;
        so.rank_hint = s;
        kvstore::node_loop srv(so);
        srv.run();
        return 0;
      }));
      kv_servers.push_back(children.back());
    }
  }
  std::vector<std::uint16_t> ports;
  if (p.with_raw) {
    for (int s = 0; s < S; ++s) {
      int fd = spawn([&](int wfd) { return raw_server(wfd, W, p.raw_bytes); });
      const std::string line = read_line(fd, std::chrono::seconds(20));
      ::close(fd);
      if (line.rfind("P ", 0) != 0) throw std::runtime_error("baseline server did not start");
      ports.push_back(static_cast<std::uint16_t>(std::stoi(line.substr(2))));
    }
  }
  // Participants: group 0 = kvstore workers, group 1 = baseline clients. Each has a result pipe
  // (lines "S ...", "E ...", "R") and a go pipe.
  struct member {
    int group, res, go;
    std::string partial;
    bool ready = false, closed = false;
  };
  std::vector<member> ms;
  for (int g = 0; g < 2; ++g)
    for (int w = 0; w < W && (g == 0 ? p.with_kv : p.with_raw); ++w) {
      int gp[2];
      if (::pipe(gp) != 0) throw std::runtime_error("pipe failed");
      int fd = spawn([&](int wfd) {
        ::close(gp[1]);
        for (auto& m : ms) ::close(m.go);  // earlier members' go pipes are not this child's
        pipe_barrier bar{wfd, gp[0]};
        return g == 0 ? p.kv_worker(wfd, cfg, o, w, bar) : p.raw_worker(wfd, cfg, ports, S, bar);
      });
      ::close(gp[0]);
      ms.push_back({g, fd, gp[1], {}});
    }
  const auto deadline = clk::now() + std::chrono::seconds(cfg.quick ? 60 : 400);
  int turn = 0;
  bool ok = true;
  auto all = [&](int g, auto pred) {
    for (auto& m : ms)
      if (m.group == g && !pred(m)) return false;
    return true;
  };
  for (;;) {
    if (all(0, [](auto& m) { return m.closed; }) && all(1, [](auto& m) { return m.closed; })) break;
    // The group whose turn it is goes on once all its members wait (or skips once all ended).
    if (all(turn, [](auto& m) { return m.closed; })) {
      turn ^= 1;
    } else if (all(turn, [](auto& m) { return m.ready || m.closed; }) &&
               !all(turn, [](auto& m) { return m.closed; })) {
      for (auto& m : ms)
        if (m.group == turn && m.ready) {
          m.ready = false;
          write_all(m.go, "G");
        }
      turn ^= 1;
      continue;
    }
    if (clk::now() > deadline) {
      std::fprintf(stderr, "kv_bench: %dx%d did not finish in time\n", W, S);
      ok = false;
      break;
    }
    std::vector<pollfd> pfds;
    for (auto& m : ms)
      if (!m.closed) pfds.push_back({m.res, POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), 500) <= 0) continue;
    for (auto& pf : pfds) {
      if (!(pf.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto& m =
          *std::find_if(ms.begin(), ms.end(), [&](auto& x) { return x.res == pf.fd && !x.closed; });
      char buf[4096];
      ssize_t n = ::read(pf.fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(pf.fd);
        m.closed = true;
        continue;
      }
      m.partial.append(buf, static_cast<std::size_t>(n));
      std::size_t nl;
      while ((nl = m.partial.find('\n')) != std::string::npos) {
        std::string l = m.partial.substr(0, nl);
        m.partial.erase(0, nl + 1);
        if (l == "R") {
          m.ready = true;
        } else if (l.rfind("S ", 0) == 0) {
          std::istringstream is(l.substr(2));
          sample smp;
          is >> smp.name >> smp.rep >> smp.ops >> smp.bytes >> smp.secs >> smp.cpu >> smp.csw >>
              smp.wire >> smp.server_cpu;
          (m.group == 0 ? kv_out : base_out).push_back(smp);
        } else if (l.rfind("E ", 0) == 0) {
          std::fprintf(stderr, "kv_bench: %s %dx%d: %s\n", m.group == 0 ? "kvstore" : "baseline", W,
                       S, l.c_str() + 2);
          ok = false;
        }
      }
    }
  }
  for (auto& m : ms) {
    ::close(m.go);
    if (!m.closed) ::close(m.res);
  }
  if (!ok) {
    kill_children();
    return false;
  }
  return reap_children(std::chrono::seconds(20));
}

}  // namespace kv_bench
