#include <kvstore/compat/multiverso.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/process.hpp"

#include <chrono>
#include <string>
#include <vector>

// Multiverso's table test as real processes: kv_launch starts a scheduler and a kv_server and two
// multiverso_tables workers, which check every value of Multiverso's array and matrix table test;
// a job whose servers or environment are not in Multiverso's mode is refused at init, naming
// the variable to set.

#ifndef KV_LAUNCH_PATH
#error "KV_LAUNCH_PATH must name the kv_launch binary (set in tests/CMakeLists.txt)"
#endif
#ifndef MULTIVERSO_TABLES_PATH
#error "MULTIVERSO_TABLES_PATH must name the multiverso_tables binary (set in tests/CMakeLists.txt)"
#endif

namespace {

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

struct run_result {
  int code;
  std::string out;
};

// kv_launch -w 2 -s 1 [launch_args] -- multiverso_tables [args], in a clean environment plus
// `env`; its exit code and output.
run_result launch(const std::vector<std::string>& launch_args, const std::vector<std::string>& args,
                  const std::vector<std::string>& env = {}) {
  kvtest::temp_dir dir;
  const std::string out = dir / "launch.out";
  std::vector<std::string> argv{KV_LAUNCH_PATH, "-w", "2", "-s", "1", "--timeout", "60"};
  argv.insert(argv.end(), launch_args.begin(), launch_args.end());
  argv.push_back("--");
  argv.push_back(MULTIVERSO_TABLES_PATH);
  argv.insert(argv.end(), args.begin(), args.end());
  auto e = kvtest::clean_environment();
  e.insert(e.end(), env.begin(), env.end());
  auto child = kvtest::spawn(std::move(argv), std::move(e), out, out);
  const int code = child.wait_exit(std::chrono::seconds(90));
  return {code, kvtest::read_file(out)};
}

}  // namespace

TEST_CASE("async: two worker processes and a kv_server, every value of the table test right" *
          doctest::timeout(90)) {
  const auto r = launch({"--type", "dist_async"}, {});
  INFO("output:\n" << r.out);
  CHECK(r.code == 0);
  CHECK(count_of(r.out, "[worker 0] multiverso_tables worker 0 of 2, async") == 1);
  CHECK(count_of(r.out, "[worker 0] multiverso_tables worker 0 ok: 1001500 values checked") == 1);
  CHECK(count_of(r.out, "[worker 1] multiverso_tables worker 1 ok: 1001500 values checked") == 1);
  CHECK(count_of(r.out, "wrong value") == 0);
}

TEST_CASE("-sync: the same with the servers at staleness 0" * doctest::timeout(90)) {
  const auto r = launch({"--type", "dist_async"}, {"--sync"}, {"KVSTORE_STALENESS=0"});
  INFO("output:\n" << r.out);
  CHECK(r.code == 0);
  CHECK(count_of(r.out, "multiverso_tables worker 1 of 2, -sync") == 1);
  CHECK(count_of(r.out, "ok: 1001500 values checked") == 2);
}

TEST_CASE("kv_server left at dist_sync: both workers refuse at init, naming KVSTORE_TYPE" *
          doctest::timeout(90)) {
  const auto r = launch({}, {});
  INFO("output:\n" << r.out);
  CHECK(r.code == 2);
  CHECK(count_of(r.out, "the servers run dist_sync rounds (2 pushes counted as 1)") == 2);
  CHECK(count_of(r.out, "KVSTORE_TYPE=dist_async") == 2);
  CHECK(count_of(r.out, "values checked") == 0);
}

TEST_CASE("-sync with another staleness in the environment: refused before joining" *
          doctest::timeout(90)) {
  // The workers exit at once; the scheduler and server, waiting for them, are stopped after
  // kv_launch's grace period.
  const auto r =
      launch({"--type", "dist_async", "--grace", "2"}, {"--sync"}, {"KVSTORE_STALENESS=3"});
  INFO("output:\n" << r.out);
  CHECK(r.code != 0);
  CHECK(count_of(r.out, "-sync (options.sync) needs staleness 0, but KVSTORE_STALENESS is 3") == 2);
}
