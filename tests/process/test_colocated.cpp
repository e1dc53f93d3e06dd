// Colocated jobs with real processes: `kv_launch -w W --colocated` starts a scheduler and W
// workers (placement_smoke) and no server process; each worker serves the shard of its rank. The
// values are exact, every process exits by itself, and a killed worker takes its shard with it:
// the other workers' ops on that shard fail naming its server instead of hanging.
#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/process.hpp"

#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#ifndef KV_LAUNCH_PATH
#error "KV_LAUNCH_PATH must name the kv_launch binary (set in tests/CMakeLists.txt)"
#endif
#ifndef PLACEMENT_SMOKE_PATH
#error "PLACEMENT_SMOKE_PATH must name the placement_smoke binary (set in tests/CMakeLists.txt)"
#endif

namespace {

using clk = std::chrono::steady_clock;
using temp_dir = kvtest::temp_dir;

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// kv_launch with a clean environment (no inherited KVSTORE_* / DMLC_*), output into one file.
struct launch {
  kvtest::child proc;
  std::string out;
  clk::time_point began = clk::now();

  launch(const temp_dir& dir, const std::vector<std::string>& args) : out(dir / "launch.out") {
    std::vector<std::string> argv{KV_LAUNCH_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    auto env = kvtest::clean_environment();
    env.push_back("KVSTORE_LOG=0");
    proc = kvtest::spawn(std::move(argv), std::move(env), out, out);
  }
  // Every case gives kv_launch --timeout 60 or less.
  int wait() { return proc.wait_exit(std::chrono::seconds(100)); }
  double elapsed() const { return std::chrono::duration<double>(clk::now() - began).count(); }
  std::string output() const { return kvtest::read_file(out); }
};

}  // namespace

TEST_CASE(
    "kv_launch -w 3 --colocated: no server process, each worker serves the shard of its "
    "rank, BigDL's rounds exact, every process exits 0" *
    doctest::timeout(90)) {
  temp_dir dir;
  launch l(dir, {"-w", "3", "--colocated", "--timeout", "60", "--", PLACEMENT_SMOKE_PATH});
  const int code = l.wait();
  const auto out = l.output();
  INFO("output:\n" << out);
  CHECK(code == 0);
  for (int r = 0; r < 3; ++r) {
    const std::string w =
        "[worker " + std::to_string(r) + "] placement_smoke rank " + std::to_string(r);
    CHECK(count_of(out, w + " of 3 workers, 3 servers, dist_sync, colocated") == 1);
    CHECK(count_of(out, w + " ok") == 1);
  }
  CHECK(count_of(out, "[server") == 0);
  CHECK(count_of(out, "wrong value") == 0);
  CHECK(l.elapsed() < 45);
}

TEST_CASE(
    "kill -9 of a colocated worker: its server dies with it, and the other worker's pull "
    "fails naming that server, not a hang" *
    doctest::timeout(90)) {
  temp_dir dir;
  launch l(dir, {"-w", "2", "--colocated", "--grace", "5", "--timeout", "50", "--",
                 PLACEMENT_SMOKE_PATH, "--hold"});
  REQUIRE_MESSAGE(kvtest::wait_until([&] { return count_of(l.output(), "holding") >= 2; },
                                     std::chrono::seconds(40)),
                  l.output());
  std::smatch m;
  const std::string before = l.output();
  REQUIRE(std::regex_search(
      before, m, std::regex(R"(\[worker 1\] placement_smoke rank 1 pid (\d+) holding)")));
  const auto t0 = clk::now();
  REQUIRE(::kill(static_cast<pid_t>(std::stol(m[1])), SIGKILL) == 0);
  const int code = l.wait();
  const double took = std::chrono::duration<double>(clk::now() - t0).count();
  const auto out = l.output();
  INFO("output:\n" << out);
  CHECK(code != 0);
  CHECK(code != 124);  // not kv_launch's timeout: the job ended by itself
  CHECK(took < 25);
  CHECK(count_of(out, "[worker 0] placement_smoke rank 0: error while holding") == 1);
  CHECK(count_of(out, "server 1 (node 10)") >= 1);
  CHECK(count_of(out, "held 60 s") == 0);
}
