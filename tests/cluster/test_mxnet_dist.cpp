// compat/mxnet.hpp's dist stores, made by name as MXNet's are: create("dist" | "dist_sync" |
// "dist_async") reads the environment, which each test points at a scheduler and a server
// running as threads of this process (support/cluster.hpp); the workers are threads too.
#include <kvstore/compat/mxnet.hpp>  // first: the header is self-contained
#include <kvstore/detail/log.hpp>

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/mxnet_checks.hpp"
#include "support/mxnet_dist.hpp"

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <vector>

using kvstore::compat::mxnet::KVStore;

namespace {

using kvtest::mxnet::pulled;
using kvtest::mxnet::run_workers;

// A cluster of `workers` workers and one server, and the environment pointing at it. The log's
// switch is read first: it is the one variable a running node reads from the environment.
struct env_cluster {
  env_cluster(int workers, bool sync)
      : log_read((kvstore::detail::log_info_enabled(), true)),
        c(kvtest::test_options(workers, 1, sync)),
        env(c.options().scheduler_port, workers, 1) {}
  bool log_read;
  kvtest::cluster c;
  kvtest::mxnet::worker_env env;
};

}  // namespace

TEST_CASE("dist: type() is the name; MXNet's sgd over 2 workers; row_sparse_pull; dispose" *
          doctest::timeout(90)) {
  env_cluster ec(2, /*sync=*/true);
  std::mutex m;
  std::set<int> ranks;
  run_workers(2, "dist", [&](KVStore& kv) {
    CHECK(kv.type() == "dist");
    CHECK(kv.num_workers() == 2);
    {
      std::lock_guard lk(m);
      ranks.insert(kv.rank());
    }
    kv.init(3, std::vector<float>(4, 0.0f));
    kv.init("embed", std::vector<float>(9, 1.0f), /*row_length=*/3);
    if (kv.rank() == 0) kv.set_optimizer(kvstore::optim::sgd{});
    kv.barrier();
    const std::vector<float> ones(4, 1.0f);
    kv.push(3, ones);
    // dist_sync: both workers' ones are summed (2), then one step of learning rate 0.01.
    CHECK(pulled(kv, 3, 4) == std::vector<float>(4, -0.02f));

    std::vector<float> out(9, 7.0f);
    kv.row_sparse_pull("embed", out, {2, 0, 2}).wait();
    CHECK(out == std::vector<float>{1, 1, 1, 0, 0, 0, 1, 1, 1});

    CHECK(kv.num_dead_node(6, 60) == 0);
    kv.dispose();  // leaves the job (meeting the other worker at the exit barrier)
    kvtest::expect_error([&] { kv.push(3, ones); }, kvstore::errc::shutdown, {"push"});
    kv.dispose();
  });
  CHECK(ranks == std::set<int>{0, 1});
}

TEST_CASE("dist_sync: set_optimizer from rank 0 alone does not hang" * doctest::timeout(90)) {
  env_cluster ec(2, /*sync=*/true);
  run_workers(2, "dist_sync", [](KVStore& kv) {
    CHECK(kv.type() == "dist_sync");
    kv.init("w", std::vector<float>(4, 1.0f));
    // No barrier: rank 1 pushes at once; its round completes when rank 0's push arrives, which
    // rank 0 sends only once every server has the optimizer, so the round gets it.
    if (kv.rank() == 0) kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.25});
    const std::vector<float> g(4, 1.0f);
    kv.push("w", g);
    CHECK(pulled(kv, "w", 4) == std::vector<float>(4, 0.5f));  // 1 - 0.25 * (1 + 1)
  });
}

TEST_CASE("dist_async: each push is applied on arrival, without the other worker's" *
          doctest::timeout(90)) {
  env_cluster ec(2, /*sync=*/false);
  run_workers(2, "dist_async", [](KVStore& kv) {
    CHECK(kv.type() == "dist_async");
    kv.init(3, std::vector<float>(4, 0.0f));
    if (kv.rank() == 0) {
      kv.set_optimizer(kvstore::optim::sgd{});
      const std::vector<float> ones(4, 1.0f);
      kv.push(3, ones);
      // Rank 1 waits at the barrier below: in dist_sync this pull would wait for its push (and
      // fail at the 10 s request deadline); in dist_async it sees rank 0's step alone.
      CHECK(pulled(kv, 3, 4) == std::vector<float>(4, -0.01f));
    }
    kv.barrier();
  });
}

TEST_CASE("dist: optimizer states saved and loaded through the layer" * doctest::timeout(90)) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("kvstore_test_mxnet_dist_" + std::to_string(::getpid()));
  const kvstore::optim::sgd opt{.learning_rate = 0.1, .momentum = 0.9};
  const std::vector<float> w0{1, 2, 3, 4};

  // The same steps on one local store, each gradient the two workers' sum (2): step, save, step
  // (A), load the saved momentum, step (B). C is B's step without the load.
  auto ref = KVStore::create("local");
  const std::vector<float> sum(4, 2.0f);
  ref.init("w", w0);
  ref.set_optimizer(opt);
  ref.push("w", sum);
  const auto ref_path = path.string() + ".ref";
  ref.save_optimizer_states(ref_path);
  ref.push("w", sum);
  const auto want_a = pulled(ref, "w", 4);
  auto loaded = KVStore::create("local");
  loaded.init("w", want_a);
  loaded.set_optimizer(opt);
  loaded.load_optimizer_states(ref_path);
  loaded.push("w", sum);  // the momentum saved after one step, then this step: B
  const auto want_b = pulled(loaded, "w", 4);
  ref.push("w", sum);  // the momentum of two steps, then this step: C
  const auto c = pulled(ref, "w", 4);
  REQUIRE(want_b != c);

  env_cluster ec(2, /*sync=*/true);
  run_workers(2, "dist", [&](KVStore& kv) {
    const std::vector<float> g(4, 1.0f);
    kv.init("w", w0);
    if (kv.rank() == 0) kv.set_optimizer(opt);
    kv.barrier();
    kv.push("w", g);
    (void)pulled(kv, "w", 4);
    if (kv.rank() == 0) kv.save_optimizer_states(path);
    kv.barrier();
    kv.push("w", g);
    CHECK(pulled(kv, "w", 4) == want_a);
    kv.barrier();  // both have pulled A before the servers' momentum goes back a step
    if (kv.rank() == 0) kv.load_optimizer_states(path);
    kv.barrier();
    kv.push("w", g);
    CHECK(pulled(kv, "w", 4) == want_b);
  });
  std::filesystem::remove(path);
  std::filesystem::remove(ref_path);
}

TEST_CASE(
    "dist: set_gradient_compression reaches the store, in MXNet's form ({'type': '2bit', "
    "'threshold': 0.5}) and as kvstore's type" *
    doctest::timeout(90)) {
  env_cluster ec(2, /*sync=*/true);
  run_workers(2, "dist_sync", [](KVStore& kv) {
    kv.init(3, std::vector<float>(4, 0.0f));
    kv.init(5, std::vector<float>(4, 0.0f));
    kv.set_gradient_compression({{"type", "2bit"}, {"threshold", "0.5"}});
    // 2-bit, threshold 0.5: a push of 0.3 sends 0 (0.3 stays in the residual), the next 0.3
    // sends 0.5. No optimizer: each round stores the two workers' sum.
    const std::vector<float> g(4, 0.3f);
    kv.push(3, g);
    CHECK(pulled(kv, 3, 4) == std::vector<float>(4, 0.0f));
    kv.push(3, g);
    CHECK(pulled(kv, 3, 4) == std::vector<float>(4, 1.0f));
    // IEEE half both ways: 0.1f travels as 0.0999755859375; the sum of two, exact in half.
    kv.set_gradient_compression({.type = kvstore::compression::fp16});
    kv.push(5, std::vector<float>(4, 0.1f));
    CHECK(pulled(kv, 5, 4) == std::vector<float>(4, 0.199951171875f));
    kvtest::expect_error(
        [&] {
          kv.set_gradient_compression({{"type", "1bit"}});
        },
        kvstore::errc::invalid_argument, {"type \"1bit\""});
  });
}
