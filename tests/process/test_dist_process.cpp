#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/process.hpp"

#include <dirent.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// Real processes: kv_launch starts a scheduler, servers (kv_server) and workers (dist_smoke);
// exit codes and output are checked, and killed servers or workers end the job with errors, not
// hangs.

#ifndef KV_LAUNCH_PATH
#error "KV_LAUNCH_PATH must name the kv_launch binary (set in tests/CMakeLists.txt)"
#endif
#ifndef DIST_SMOKE_PATH
#error "DIST_SMOKE_PATH must name the dist_smoke binary (set in tests/CMakeLists.txt)"
#endif

namespace {

namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

using kvtest::read_file;
using temp_dir = kvtest::temp_dir;

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// kv_launch with a clean environment (no inherited KVSTORE_* / DMLC_* settings) plus `env`, its
// stdout and stderr into one file.
struct launch {
  kvtest::child proc;
  std::string out;
  clk::time_point began = clk::now();

  launch(const temp_dir& dir, const std::vector<std::string>& args,
         const std::vector<std::string>& env = {})
      : out(dir / "launch.out") {
    std::vector<std::string> argv{KV_LAUNCH_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    auto e = kvtest::clean_environment();
    e.insert(e.end(), env.begin(), env.end());
    proc = kvtest::spawn(std::move(argv), std::move(e), out, out);
  }
  pid_t pid() const { return proc.pid(); }
  // Waits for kv_launch to exit (every case gives it --timeout 60 or less); returns its exit code.
  int wait() { return proc.wait_exit(std::chrono::seconds(100)); }
  double elapsed() const { return std::chrono::duration<double>(clk::now() - began).count(); }
  std::string output() const { return read_file(out); }
  // Waits until the output contains `text` `times` times.
  bool wait_for(const std::string& text, int times, std::chrono::seconds limit) const {
    return kvtest::wait_until([&] { return count_of(output(), text) >= times; }, limit);
  }
};

// Children of `parent` whose command line contains every one of `parts` (NUL-separated argv).
std::vector<pid_t> children_matching(pid_t parent, const std::vector<std::string>& parts) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    const std::string stat = read_file(fs::path("/proc") / e->d_name / "stat");
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(close_paren + 2));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    const std::string cmd = read_file(fs::path("/proc") / e->d_name / "cmdline");
    bool all = true;
    for (auto& p : parts) all = all && cmd.find(p) != std::string::npos;
    if (all) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

}  // namespace

TEST_CASE("kv_launch -w 2 -s 2 runs dist_smoke: every worker's values are right, exit code 0" *
          doctest::timeout(60)) {
  temp_dir dir;
  launch l(dir, {"-w", "2", "-s", "2", "--timeout", "60", "--", DIST_SMOKE_PATH});
  const int code = l.wait();
  const auto out = l.output();
  INFO("output:\n" << out);
  CHECK(code == 0);
  CHECK(count_of(out, "[worker 0] dist_smoke rank 0 of 2 workers, dist_sync") == 1);
  CHECK(count_of(out, "[worker 1] dist_smoke rank 1 of 2 workers, dist_sync") == 1);
  CHECK(count_of(out, "[worker 0] dist_smoke rank 0 ok") == 1);
  CHECK(count_of(out, "[worker 1] dist_smoke rank 1 ok") == 1);
  CHECK(count_of(out, "wrong value") == 0);
  CHECK(l.elapsed() < 30);
}

TEST_CASE("three workers, one server: the sums follow the worker count" * doctest::timeout(60)) {
  temp_dir dir;
  launch l(dir, {"-w", "3", "-s", "1", "--timeout", "60", "--", DIST_SMOKE_PATH});
  const int code = l.wait();
  const auto out = l.output();
  INFO("output:\n" << out);
  CHECK(code == 0);
  for (int r = 0; r < 3; ++r)
    CHECK(count_of(out, "[worker " + std::to_string(r) + "] dist_smoke rank " + std::to_string(r) +
                            " ok") == 1);
}

TEST_CASE("a worker that sees a wrong value fails the job with its exit code" *
          doctest::timeout(60)) {
  temp_dir dir;
  launch l(dir, {"-w", "2", "-s", "2", "--grace", "5", "--timeout", "60", "--", DIST_SMOKE_PATH,
                 "--wrong"});
  const int code = l.wait();
  const auto out = l.output();
  INFO("output:\n" << out);
  CHECK(code == 1);
  CHECK(count_of(out, "wrong value: key 1 in round 1 is 3, expected 4") >= 1);
  CHECK(count_of(out, "dist_smoke rank 0 ok") == 0);
}

TEST_CASE("kill -9 of a server process: the workers fail with an error naming it, not a hang" *
          doctest::timeout(60)) {
  temp_dir dir;
  launch l(dir, {"-w", "2", "-s", "2", "--grace", "5", "--timeout", "50", "--", DIST_SMOKE_PATH,
                 "--hold"});
  REQUIRE_MESSAGE(l.wait_for("holding", 2, std::chrono::seconds(30)), l.output());
  auto servers = children_matching(l.pid(), {std::string("--role\0server\0", 13)});
  REQUIRE(servers.size() == 2);
  const std::string env = read_file(fs::path("/proc") / std::to_string(servers[0]) / "environ");
  const bool rank0 = env.find(std::string("KVSTORE_RANK=0") + '\0') != std::string::npos;
  const std::string victim = rank0 ? "server 0 (node 8)" : "server 1 (node 10)";
  const auto t0 = clk::now();
  REQUIRE(::kill(servers[0], SIGKILL) == 0);
  const int code = l.wait();
  const double took = std::chrono::duration<double>(clk::now() - t0).count();
  const auto out = l.output();
  INFO("output:\n" << out);
  CHECK(code != 0);
  CHECK(code != 124);  // not kv_launch's timeout: the job ended by itself
  CHECK(took < 20);
  // Every worker reported the lost server (by rank) rather than hanging or being killed.
  CHECK(count_of(out, "error while holding") == 2);
  CHECK(count_of(out, victim) >= 2);
  CHECK(count_of(out, "held 60 s") == 0);
}

TEST_CASE("kill -9 of a worker process: the other worker's sync push fails naming it" *
          doctest::timeout(60)) {
  temp_dir dir;
  // By default a dead worker leaves the sync group; with "fail" the others' rounds fail naming it.
  launch l(
      dir,
      {"-w", "2", "-s", "1", "--grace", "5", "--timeout", "50", "--", DIST_SMOKE_PATH, "--hold"},
      {"KVSTORE_ON_WORKER_DEATH=fail"});
  REQUIRE_MESSAGE(l.wait_for("holding", 2, std::chrono::seconds(30)), l.output());
  auto workers = children_matching(l.pid(), {"dist_smoke", "--hold"});
  REQUIRE(workers.size() == 2);
  // Which rank is it? kv_launch gives each worker KVSTORE_RANK.
  const std::string env = read_file(fs::path("/proc") / std::to_string(workers[0]) / "environ");
  const bool rank0 = env.find(std::string("KVSTORE_RANK=0") + '\0') != std::string::npos;
  const std::string victim = rank0 ? "worker 0 (node 9)" : "worker 1 (node 11)";
  const std::string survivor = rank0 ? "[worker 1]" : "[worker 0]";
  const auto t0 = clk::now();
  REQUIRE(::kill(workers[0], SIGKILL) == 0);
  const int code = l.wait();
  const double took = std::chrono::duration<double>(clk::now() - t0).count();
  const auto out = l.output();
  INFO("output:\n" << out);
  CHECK(code != 0);
  CHECK(code != 124);
  CHECK(took < 20);
  CHECK(count_of(out, survivor + " dist_smoke rank " + (rank0 ? "1" : "0") +
                          ": error while holding") == 1);
  CHECK(count_of(out, victim) >= 1);
}
