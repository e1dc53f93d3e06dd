// compat/mxnet.hpp launched SPMD, as MXNet's scripts are: every process of the job calls
// KVStore::create with the same name and its role comes from the environment. This binary is
// re-executed as the scheduler and the server (with no KVSTORE_TYPE set), and its own threads are
// the two workers. create("dist_async") must make the server run dist_async: a worker's pull
// after its own push then does not wait for the other worker.
#include <kvstore/compat/mxnet.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/helpers.hpp"
#include "support/mxnet_checks.hpp"
#include "support/mxnet_dist.hpp"
#include "support/process.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

using kvstore::compat::mxnet::KVStore;

// With KVTEST_SPMD_CHILD set, this case is the scheduler or server of the job: create() runs
// that role and exits the process. In a normal run it does nothing.
TEST_CASE("spmd child (runs only when re-executed by the test below)" * doctest::timeout(90)) {
  const char* name = std::getenv("KVTEST_SPMD_CHILD");
  if (!name) return;
  try {
    (void)KVStore::create(name);
  } catch (const std::exception& e) {
    std::printf("spmd child failed: %s\n", e.what());
  }
  std::_Exit(1);  // a server or scheduler exits inside create()
}

TEST_CASE("create(\"dist_async\") launched SPMD: the servers run dist_async" *
          doctest::timeout(120)) {
  kvtest::temp_dir dir("kvstore-mxnet-spmd");
  const std::uint16_t port = kvtest::free_port();
  auto env = [&](const std::string& role) {
    auto e = kvtest::clean_environment();  // no KVSTORE_TYPE: the name given decides
    e.insert(e.end(), {"KVTEST_SPMD_CHILD=dist_async", "KVSTORE_ROLE=" + role,
                       "KVSTORE_SCHEDULER=127.0.0.1:" + std::to_string(port),
                       "KVSTORE_NUM_WORKERS=2", "KVSTORE_NUM_SERVERS=1"});
    return e;
  };
  const std::vector<std::string> argv = {"/proc/self/exe", "--test-case=spmd child*"};
  auto sched = kvtest::spawn(argv, env("scheduler"), dir / "scheduler.out", dir / "scheduler.out");
  auto server = kvtest::spawn(argv, env("server"), dir / "server.out", dir / "server.out");
  INFO(kvtest::read_file(dir / "scheduler.out") << kvtest::read_file(dir / "server.out"));

  kvtest::mxnet::worker_env worker(port, 2, 1);
  kvtest::mxnet::run_workers(2, "dist_async", [](KVStore& kv) {
    CHECK(kv.type() == "dist_async");
    kv.init(3, std::vector<float>(4, 0.0f));
    if (kv.rank() == 0) {
      kv.set_optimizer(kvstore::optim::sgd{});
      const std::vector<float> ones(4, 1.0f);
      kv.push(3, ones);
      // Rank 1 waits at the barrier: a dist_sync server would hold this pull for its push until
      // the 10 s request deadline.
      CHECK(kvtest::mxnet::pulled(kv, 3, 4) == std::vector<float>(4, -0.01f));
    }
    kv.barrier();
  });
  // The job ends when both workers left: the scheduler and server exit cleanly.
  CHECK(sched.wait_exit(std::chrono::seconds(30)) == 0);
  CHECK(server.wait_exit(std::chrono::seconds(30)) == 0);
}
