#include <kvstore/dist.hpp>  // first: the header is self-contained

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

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

extern char** environ;

namespace {

namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct temp_dir {
  fs::path path;
  temp_dir() {
    char tmpl[] = "/tmp/kvtest_dist_process_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct launch {
  pid_t pid = -1;
  fs::path out;
  clk::time_point began = clk::now();
  int code = -1;
  bool reaped = false;

  launch(const temp_dir& dir, const std::vector<std::string>& args, const std::vector<std::string>& env = {})
      : out(dir.path / "launch.out") {
    std::vector<std::string> argv_s{KV_LAUNCH_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    // A clean environment for the cluster: no inherited KVSTORE_* / DMLC_* settings.
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "KVSTORE_", 8) != 0 && std::strncmp(*e, "DMLC_", 5) != 0) env_s.emplace_back(*e);
    env_s.insert(env_s.end(), env.begin(), env.end());
    std::vector<char*> envp;
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE(rc == 0);
  }
  ~launch() {
    if (!reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  // Waits for kv_launch to exit; returns its exit code.
  int wait() {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    reaped = true;
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return code;
  }
  double elapsed() const { return std::chrono::duration<double>(clk::now() - began).count(); }
  std::string output() const { return read_file(out); }
  // Waits until the output contains `text` `times` times.
  bool wait_for(const std::string& text, int times, std::chrono::seconds limit) const {
    const auto until = clk::now() + limit;
    for (;;) {
      const auto o = output();
      int n = 0;
      for (auto p = o.find(text); p != std::string::npos; p = o.find(text, p + 1)) ++n;
      if (n >= times) return true;
      if (clk::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

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
    CHECK(count_of(out, "[worker " + std::to_string(r) + "] dist_smoke rank " + std::to_string(r) + " ok") == 1);
}

TEST_CASE("a worker that sees a wrong value fails the job with its exit code" * doctest::timeout(60)) {
  temp_dir dir;
  launch l(dir, {"-w", "2", "-s", "2", "--grace", "5", "--timeout", "60", "--", DIST_SMOKE_PATH, "--wrong"});
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
  launch l(dir, {"-w", "2", "-s", "2", "--grace", "5", "--timeout", "50", "--", DIST_SMOKE_PATH, "--hold"});
  REQUIRE_MESSAGE(l.wait_for("holding", 2, std::chrono::seconds(30)), l.output());
  auto servers = children_matching(l.pid, {std::string("--role\0server\0", 13)});
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

TEST_CASE("kill -9 of a worker process: the other worker's sync push fails naming it" * doctest::timeout(60)) {
  temp_dir dir;
  // By default a dead worker leaves the sync group; with "fail" the others' rounds fail naming it.
  launch l(dir, {"-w", "2", "-s", "1", "--grace", "5", "--timeout", "50", "--", DIST_SMOKE_PATH, "--hold"},
           {"KVSTORE_ON_WORKER_DEATH=fail"});
  REQUIRE_MESSAGE(l.wait_for("holding", 2, std::chrono::seconds(30)), l.output());
  auto workers = children_matching(l.pid, {"dist_smoke", "--hold"});
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
  CHECK(count_of(out, survivor + " dist_smoke rank " + (rank0 ? "1" : "0") + ": error while holding") == 1);
  CHECK(count_of(out, victim) >= 1);
}
