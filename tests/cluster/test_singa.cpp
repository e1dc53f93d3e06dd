#include <kvstore/compat/singa.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

// SINGA's worker group over kvstore: N threads of one process share one store; the owner puts a
// param, every worker sends its gradient of a step, the N-th pushes the mean once. Over
// KVStore<local>, and over KVStore<dist> with two groups as threads-as-ranks (scheduler, server
// and both groups' stores in this process, real loopback TCP). Values are exact.

namespace singa = kvstore::compat::singa;
using kvstore::errc;
using kvtest::expect_error;
using local_store = kvstore::KVStore<kvstore::local>;
using dist_store = kvstore::KVStore<kvstore::dist>;

namespace {

using clk = std::chrono::steady_clock;

// Runs f(worker) on n threads and joins them.
template <class F>
void on_threads(int n, F f) {
  std::vector<std::thread> ts;
  for (int w = 0; w < n; ++w) ts.emplace_back([&f, w] { f(w); });
  for (auto& t : ts) t.join();
}

}  // namespace

TEST_CASE(
    "4 threads, sgd lr 0.1, gradients 1..4: one step of the mean, w == 0.75, version 1; "
    "collect(step 1) waits for the 4th update" *
    doctest::timeout(30)) {
  local_store kv;
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.1});
  singa::WorkerGroup<local_store> group(kv, 4);
  group.put(0, "w", std::vector<float>{1, 1});
  CHECK(group.version("w") == 0);

  std::atomic<bool> collected{false};
  std::vector<float> seen(2);
  std::thread collector([&] {
    group.collect(2, "w", 1, seen);
    collected = true;
  });
  for (int i = 0; i < 3; ++i) group.update(i, "w", std::vector<float>(2, float(i + 1)), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(collected.load());   // still waiting after the 3rd update
  CHECK(group.version("w") == 0);  // and nothing was pushed
  group.update(3, "w", std::vector<float>(2, 4.0f), 0);
  collector.join();
  CHECK(collected.load());
  // mean 2.5: 1 - 0.1 * 2.5 = 0.75 (averaging twice would give 1 - 0.1 * 0.625 = 0.9375)
  CHECK(seen == std::vector<float>{0.75f, 0.75f});
  CHECK(group.version("w") == 1);
}

TEST_CASE("several params and steps from 4 threads: one push per param per step" *
          doctest::timeout(30)) {
  local_store kv;
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5});
  singa::WorkerGroup<local_store> group(kv, 4);
  on_threads(4, [&](int w) {
    // Worker 1 owns "b", worker 0 "a"; the others wait for the puts in collect(step 0).
    if (w == 0) group.put(w, "a", std::vector<float>(3, 0.0f));
    if (w == 1) group.put(w, "b", std::vector<float>(1, 10.0f));
    std::vector<float> a(3), b(1);
    group.collect(w, "a", 0, a);
    group.collect(w, "b", 0, b);
    for (int step = 1; step <= 5; ++step) {
      // Gradients: a gets w + 1 (mean 2.5), b gets 2 w (mean 3).
      group.update(w, "b", std::vector<float>(1, 2.0f * float(w)), step - 1);  // from 0
      group.update(w, "a", std::vector<float>(3, float(w + 1)), step - 1);
      group.collect(w, "a", step, a);
      group.collect(w, "b", step, b);
      // Each step moves a by -0.5 * 2.5 and b by -0.5 * 3; a worker may see later steps too.
      CHECK(a[0] <= -1.25f * float(step));
      CHECK(b[0] <= 10.0f - 1.5f * float(step));
    }
  });
  std::vector<float> a(3), b(1);
  group.collect(0, "a", 5, a);
  group.collect(0, "b", 5, b);
  CHECK(a == std::vector<float>(3, -6.25f));
  CHECK(b == std::vector<float>{2.5f});
  CHECK(group.version("a") == 5);
  CHECK(group.version("b") == 5);
}

TEST_CASE("misuse: a clear error naming the param and step, nothing pushed" *
          doctest::timeout(30)) {
  local_store kv;
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1});
  singa::WorkerGroup<local_store> group(kv, 2, {.timeout = std::chrono::milliseconds(200)});
  std::vector<float> out(2);
  // Nobody put it: bounded waits.
  expect_error([&] { group.collect(0, "w", 0, out); }, errc::timeout,
               {"collect of param \"w\" step 0 by worker 0", "200 ms", "never put"});
  expect_error([&] { group.update(1, "w", out, 0); }, errc::timeout, {"update", "never put"});

  group.put(0, "w", std::vector<float>{1, 2});
  expect_error([&] { group.put(1, "w", out); }, errc::already_inited,
               {"put of param \"w\" by worker 1", "already put by worker 0"});
  expect_error([&] { group.update(2, "w", out, 0); }, errc::invalid_argument,
               {"worker 2 is not in [0, 2)"});
  expect_error([&] { group.update(0, "w", std::vector<float>(3), 0); }, errc::size_mismatch,
               {"param \"w\" step 0", "3 values, the param 2"});
  // SINGA numbers steps from 0: a first step 1 is refused, and so is a step sent twice.
  expect_error([&] { group.update(0, "w", out, 1); }, errc::invalid_argument,
               {"step 1 by worker 0", "next step is 0", "steps 0, 1, 2"});
  group.update(0, "w", std::vector<float>{2, 2}, 0);
  expect_error([&] { group.update(0, "w", out, 0); }, errc::invalid_argument,
               {"step 0 by worker 0", "next step is 1"});
  // Only one of the two workers sent step 0: collect of version 1 times out saying so.
  expect_error([&] { group.collect(1, "w", 1, out); }, errc::timeout,
               {"step 1 by worker 1", "pushed 0 step(s)", "step 0 has 1 of 2 workers"});
  expect_error([&] { group.collect(1, "w", 0, std::span<float>(out).first(1)); },
               errc::size_mismatch, {"room for 1"});
  CHECK(group.version("w") == 0);
  group.update(1, "w", std::vector<float>{4, 4}, 0);
  group.collect(1, "w", 1, out);  // the first update (step 0) leaves version 1, as SINGA's
  CHECK(out == std::vector<float>{-2, -1});  // {1, 2} - mean 3
  CHECK(group.version("w") == 1);
  expect_error([&] { singa::WorkerGroup<local_store> none(kv, 0); }, errc::invalid_argument,
               {"at least one worker"});
}

TEST_CASE(
    "dist_sync, two groups of 4 threads (one per process): the round is the mean over all "
    "8 workers, one step" *
    doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(2, 1, /*sync=*/true));
  c.run_workers([](dist_store& kv) {
    const int g = kv.rank();
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.1});
    singa::WorkerGroup<dist_store> group(kv, 4);
    on_threads(4, [&](int w) {
      if (w == 3) {  // the owner of both params in each group
        group.put(w, "same", std::vector<float>{1, 1});
        group.put(w, "mixed", std::vector<float>{1, 1});
      }
      std::vector<float> out(2);
      group.collect(w, "same", 0, out);
      CHECK(out == std::vector<float>{1, 1});
      // "same": thread i of either group sends i + 1 (mean 2.5); "mixed": group 1 sends i + 5
      // (the mean over all 8 is 4.5).
      group.update(w, "same", std::vector<float>(2, float(w + 1)), 0);
      group.update(w, "mixed", std::vector<float>(2, float(w + 1 + 4 * g)), 0);
      group.collect(w, "same", 1, out);
      CHECK(out == std::vector<float>{0.75f, 0.75f});  // a sum of the groups' means: 0.5
      group.collect(w, "mixed", 1, out);
      CHECK(out[0] == doctest::Approx(1.0 - 0.1 * 4.5).epsilon(1e-6));  // not 1 - 0.1 * 9
    });
    CHECK(group.version("same") == 1);
    CHECK(group.version("mixed") == 1);
  });
}

TEST_CASE("dist_async with staleness 0: a group's collect waits for the slower group's step" *
          doctest::timeout(60)) {
  // Group 0 sends gradient 2.5 per step, group 1 (slow: it sleeps before step 2) 6.5; each
  // group's push is its own sgd step (lr 0.5). Group 0's collect of step 2 must wait for group
  // 1's second push: 1 - 0.5 (2.5 + 6.5 + 2.5 + 6.5) = -8.
  for (bool bounded : {true, false}) {
    CAPTURE(bounded);
    auto o = kvtest::test_options(2, 1, /*sync=*/false);
    if (bounded) o.staleness = 0;
    kvtest::cluster c(o);
    double waited = 0;
    std::vector<float> seen(1);
    c.run_workers([&](dist_store& kv) {
      const int g = kv.rank();
      kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5});
      kv.barrier();  // both have set it before either pushes (dist_async)
      singa::WorkerGroup<dist_store> group(kv, 2);
      on_threads(2, [&](int w) {
        if (w == 0) group.put(w, "w", std::vector<float>{1});
        std::vector<float> out(1);
        const float grad = g == 0 ? 2.5f : 6.5f;
        group.update(w, "w", std::vector<float>{grad}, 0);
        group.collect(w, "w", 1, out);
        if (g == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
        group.update(w, "w", std::vector<float>{grad}, 1);
        const auto t0 = clk::now();
        group.collect(w, "w", 2, out);
        if (g == 0 && w == 0) {
          waited = std::chrono::duration<double>(clk::now() - t0).count();
          seen = out;
        }
      });
      kv.barrier();
      CHECK(group.version("w") == 4);  // every group's pushes counted
    });
    if (bounded) {
      CHECK(seen[0] == -8.0f);
      CHECK(waited > 0.2);
    } else {
      CHECK(seen[0] > -8.0f);  // read at once, before the slow group's second step
      CHECK(waited < 0.3);
    }
  }
}
