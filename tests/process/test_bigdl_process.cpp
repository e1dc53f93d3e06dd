// compat/bigdl.hpp in real processes: `kv_launch -w 3 --colocated` starts a scheduler and three
// bigdl_smoke nodes, each serving its own partition; every node checks BigDL's exact values
// (fp16, bf16, none) and the routing of every chunk, and exits 0. A job with one server for two
// workers is refused by every node with an error naming the parameter and partition_num.
#include <kvstore/compat/bigdl.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/process.hpp"

#include <chrono>
#include <string>
#include <vector>

#ifndef KV_LAUNCH_PATH
#error "KV_LAUNCH_PATH must name the kv_launch binary (set in tests/CMakeLists.txt)"
#endif
#ifndef BIGDL_SMOKE_PATH
#error "BIGDL_SMOKE_PATH must name the bigdl_smoke binary (set in tests/CMakeLists.txt)"
#endif

namespace {

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// kv_launch ARGS -- bigdl_smoke with a clean environment; returns (exit code, output).
std::pair<int, std::string> launch(const std::vector<std::string>& args) {
  kvtest::temp_dir dir;
  const std::string out = dir / "launch.out";
  std::vector<std::string> argv{KV_LAUNCH_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--timeout", "60", "--", BIGDL_SMOKE_PATH});
  auto env = kvtest::clean_environment();
  env.push_back("KVSTORE_LOG=0");
  auto proc = kvtest::spawn(std::move(argv), std::move(env), out, out);
  const int code = proc.wait_exit(std::chrono::seconds(100));
  return {code, kvtest::read_file(out)};
}

}  // namespace

TEST_CASE(
    "kv_launch -w 3 --colocated: three bigdl_smoke nodes, each its own server, BigDL's exact "
    "values in fp16, bf16 and none, every process exits 0" *
    doctest::timeout(110)) {
  const auto [code, out] = launch({"-w", "3", "--colocated"});
  INFO("output:\n" << out);
  CHECK(code == 0);
  for (int r = 0; r < 3; ++r) {
    const std::string w =
        "[worker " + std::to_string(r) + "] bigdl_smoke rank " + std::to_string(r);
    CHECK(count_of(out, w + " of 3 workers, 3 servers, dist_sync, colocated") == 1);
    CHECK(count_of(out, w + " ok") == 1);
  }
  CHECK(count_of(out, "[server") == 0);  // no server processes: the nodes serve
  CHECK(count_of(out, "wrong value") == 0);
}

TEST_CASE(
    "kv_launch -w 2 -s 1: one server for two nodes is refused by each, naming the parameter "
    "and partition_num" *
    doctest::timeout(110)) {
  const auto [code, out] = launch({"-w", "2", "-s", "1"});
  INFO("output:\n" << out);
  CHECK(code != 0);
  CHECK(code != 124);  // not kv_launch's timeout: the nodes ended by themselves
  CHECK(count_of(out,
                 "AllReduceParameter 1: constructor: partition_num 2 differs from the "
                 "job's 1 servers") == 2);
  CHECK(count_of(out, " ok") == 0);
}
