// Versions and bounded staleness over real loopback TCP (ranks as threads, a dying worker as a
// child process): kv.version in dist_sync and dist_async, pulls that wait for a min_version and
// one that fails at its deadline, and SSP: a worker too far ahead waits (its pull is still
// pending after a delay) and proceeds once the slower worker pushes, leaves or dies.
#include <kvstore/dist.hpp>  // first: the header is self-contained
// The server and scheduler classes themselves (kvstore.hpp declares only kvstore::node_loop).
#include <kvstore/server/server.hpp>

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/process.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// Waits until `flag` is set, at most `limit`; false if it never was.
bool wait_for(const std::atomic<bool>& flag, std::chrono::milliseconds limit = 20s) {
  const auto until = clock_type::now() + limit;
  while (!flag.load()) {
    if (clock_type::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// A pull the server holds stays pending: still not done after `delay`.
void check_still_pending(const kvstore::op& p, std::chrono::milliseconds delay = 300ms) {
  std::this_thread::sleep_for(delay);
  CHECK_FALSE(p.ready());
}

// w += g on the servers: each value then counts the pushes exactly.
void sum_pushes(kvstore::KVStore<kvstore::dist>& kv) {
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
}

kvstore::dist_options async_with_staleness(int workers, std::uint64_t staleness) {
  auto o = kvtest::test_options(workers, 1, /*sync=*/false);
  o.staleness = staleness;
  return o;
}

std::string self_exe;

}  // namespace

TEST_CASE("dist_sync: a key's version is its rounds completed, the least over its slices" *
          doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(2, 2));
  c.run_workers([](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> w(10, 0.f), small(3, 0.f), out(10);
    // "w" is sliced over both servers; key 3 lives on one.
    kv.init("w", w, kvstore::init_options{.partition = kvstore::partition::even});
    kv.init(3, small);
    CHECK(kv.version("w") == 0);
    CHECK(kv.version(3) == 0);
    for (std::uint64_t r = 1; r <= 3; ++r) {
      std::vector<float> g(10, static_cast<float>(kv.rank() + 1));
      kv.push("w", g).wait();
      // The round this push belongs to is complete; the next one needs this worker's push.
      CHECK(kv.version("w") == r);
      kv.pull("w", out).wait();
      CHECK(out[0] == 3.f);
      CHECK(out[9] == 3.f);
    }
    CHECK(kv.version(3) == 0);
    CHECK_THROWS_WITH_AS(kv.version(99), doctest::Contains("key 99"), kvstore::error);
  });
}

TEST_CASE("dist_async: a key's version counts the pushes of all workers" * doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(2, 2, /*sync=*/false));
  c.run_workers([](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> w(10, 0.f), out(10);
    kv.init("w", w, kvstore::init_options{.partition = kvstore::partition::even});
    sum_pushes(kv);
    std::vector<float> g(10, 1.f);
    for (std::uint64_t n = 1; n <= 3; ++n) {
      kv.push("w", g).wait();
      CHECK(kv.version("w") >= n);  // this worker's pushes are applied; the other's may be too
    }
    kv.barrier();  // every push of both workers was answered, so applied
    CHECK(kv.version("w") == 6);
    kv.pull("w", out).wait();
    CHECK(out[0] == 6.f);
    CHECK(out[9] == 6.f);
  });
}

TEST_CASE("min_version: the pull waits until the key reaches it, then reads that value" *
          doctest::timeout(60)) {
  SUBCASE("dist_async") {
    kvtest::cluster c(kvtest::test_options(2, 1, /*sync=*/false));
    std::atomic<bool> pushed_two{false}, checked{false};
    c.run_workers([&](kvstore::KVStore<kvstore::dist>& kv) {
      std::vector<float> w(4, 0.f), out(4, -1.f), g(4, 1.f);
      kv.init(5, w);
      sum_pushes(kv);
      if (kv.rank() == 0) {
        kv.push(5, g).wait();
        kv.push(5, g).wait();
        pushed_two = true;
        REQUIRE(wait_for(checked));
        kv.push(5, g).wait();
      } else {
        REQUIRE(wait_for(pushed_two));
        CHECK(kv.version(5) == 2);
        auto p = kv.pull(5, out, kvstore::pull_options{.priority = 0, .min_version = 3});
        check_still_pending(p);
        checked = true;
        p.wait();
        CHECK(out == std::vector<float>(4, 3.f));
        CHECK(kv.version(5) == 3);
      }
    });
  }
  SUBCASE("dist_sync: a worker that left reads a later round") {
    kvtest::cluster c(kvtest::test_options(2, 1));
    std::atomic<bool> left{false}, pulled{false}, checked{false};
    c.run_workers([&](kvstore::KVStore<kvstore::dist>& kv) {
      std::vector<float> w(4, 0.f), out(4, -1.f);
      kv.init(5, w);
      if (kv.rank() == 1) {
        kv.leave();
        left = true;
        REQUIRE(wait_for(pulled));
        auto p = kv.pull(5, out, kvstore::pull_options{.min_version = 2});
        check_still_pending(p);
        checked = true;
        p.wait();
        CHECK(out == std::vector<float>(4, 2.f));  // round 2's sum: worker 0's push alone
      } else {
        REQUIRE(wait_for(left));
        kv.push(5, std::vector<float>(4, 1.f)).wait();
        CHECK(kv.version(5) == 1);
        pulled = true;
        REQUIRE(wait_for(checked));
        kv.push(5, std::vector<float>(4, 2.f)).wait();
        CHECK(kv.version(5) == 2);
      }
    });
  }
}

TEST_CASE("a min_version never reached fails at the deadline, naming the key and the version" *
          doctest::timeout(60)) {
  auto o = kvtest::test_options(1, 1, /*sync=*/false);
  o.request_timeout = 1500ms;
  kvtest::cluster c(o);
  c.run_workers([](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> w{1, 2}, out{-1, -1};
    kv.init(5, w);
    kv.init(6, w);
    const auto start = clock_type::now();
    auto p = kv.pull(5, out, kvstore::pull_options{.min_version = 100});
    try {
      p.wait();
      FAIL("a version never reached was served");
    } catch (const kvstore::error& e) {
      const auto waited = clock_type::now() - start;
      CHECK(e.code() == kvstore::errc::timeout);
      const std::string msg = e.what();
      CHECK_MESSAGE(msg.find("key 5") != std::string::npos, msg);
      CHECK_MESSAGE(msg.find("version 100") != std::string::npos, msg);
      // Within the deadline, not long before it.
      CHECK(waited >= 1000ms);
      CHECK(waited <= 3000ms);
    }
    CHECK(out == std::vector<float>{-1, -1});  // nothing was written
    // The server serves on, the key included.
    kv.pull(6, out).wait();
    CHECK(out == std::vector<float>{1, 2});
    kv.push(5, std::vector<float>{7, 8}).wait();
    kv.pull(5, out, kvstore::pull_options{.min_version = 1}).wait();
    CHECK(out == std::vector<float>{7, 8});
    CHECK(kv.version(5) == 1);
  });
}

TEST_CASE("held pulls are bounded per worker: one over the limit is refused, the rest served" *
          doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 1, /*sync=*/false);
  o.max_held_pulls = 2;
  kvtest::cluster c(o);
  std::atomic<bool> refused{false};
  c.run_workers([&](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> w{0}, y{-1};
    for (int k = 1; k <= 4; ++k) kv.init(k, w);
    if (kv.rank() == 1) {
      // The pushes that let worker 0's held pulls go (its own would queue behind them).
      REQUIRE(wait_for(refused));
      for (int k = 1; k <= 3; ++k) kv.push(k, std::vector<float>{static_cast<float>(k + 4)}).wait();
      return;
    }
    // Three pulls of different keys waiting for version 1: ops on different keys may reach the
    // server in any order, so whichever comes third is the one refused.
    std::vector<std::vector<float>> outs(3, std::vector<float>{-1});
    std::vector<kvstore::op> pulls;
    for (int k = 1; k <= 3; ++k)
      pulls.push_back(kv.pull(k, outs[static_cast<std::size_t>(k - 1)],
                              kvstore::pull_options{.min_version = 1}));
    int refused_key = 0;  // the refusal comes first: the others wait for pushes
    for (int spins = 0; spins < 20000 && !refused_key; ++spins) {
      for (int k = 1; k <= 3 && !refused_key; ++k) {
        auto& p = pulls[static_cast<std::size_t>(k - 1)];
        if (!p.ready()) continue;
        try {
          p.wait();
          FAIL("a held pull was answered before any push");
        } catch (const kvstore::error& e) {
          CHECK(e.code() == kvstore::errc::invalid_argument);
          const std::string msg = e.what();
          CHECK_MESSAGE(msg.find("KVSTORE_MAX_HELD_PULLS") != std::string::npos, msg);
          CHECK_MESSAGE(msg.find("refused a pull of key " + std::to_string(k)) != std::string::npos,
                        msg);
          refused_key = k;
        }
      }
      if (!refused_key) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(refused_key != 0);
    kv.pull(4, y).wait();  // not held: served
    CHECK(y == std::vector<float>{0});
    for (int k = 1; k <= 3; ++k)
      if (k != refused_key) CHECK_FALSE(pulls[static_cast<std::size_t>(k - 1)].ready());
    refused = true;
    for (int k = 1; k <= 3; ++k) {
      if (k == refused_key) {
        CHECK(outs[static_cast<std::size_t>(k - 1)] == std::vector<float>{-1});
        continue;
      }
      pulls[static_cast<std::size_t>(k - 1)].wait();
      CHECK(outs[static_cast<std::size_t>(k - 1)] == std::vector<float>{static_cast<float>(k + 4)});
    }
  });
}

TEST_CASE("staleness: a worker too far ahead waits, and proceeds once the slow one pushes" *
          doctest::timeout(60)) {
  for (std::uint64_t bound : {0u, 1u}) {
    CAPTURE(bound);
    kvtest::cluster c(async_with_staleness(2, bound));
    std::atomic<bool> fast_waits{false}, slow_pushed{false};
    c.run_workers([&](kvstore::KVStore<kvstore::dist>& kv) {
      std::vector<float> w(3, 0.f), out(3), g(3, 1.f);
      kv.init(9, w);
      sum_pushes(kv);
      if (kv.rank() == 0) {
        // Within the bound (ahead by staleness pushes at most): answered without the slow one.
        for (std::uint64_t i = 0; i < bound; ++i) kv.push(9, g).wait();
        const auto start = clock_type::now();
        kv.pull(9, out).wait();
        CHECK(clock_type::now() - start < 2s);
        CHECK(out[0] == static_cast<float>(bound));
        // One push more: beyond the bound, the pull waits for worker 1.
        kv.push(9, g).wait();
        auto p = kv.pull(9, out);
        check_still_pending(p, 500ms);
        fast_waits = true;
        p.wait();
        CHECK(slow_pushed.load());
        CHECK(out == std::vector<float>(3, static_cast<float>(bound + 1 + 10)));
      } else {
        REQUIRE(wait_for(fast_waits));
        slow_pushed = true;
        kv.push(9, std::vector<float>(3, 10.f)).wait();
      }
    });
  }
}

TEST_CASE("staleness: a worker that leaves no longer holds the others back" *
          doctest::timeout(60)) {
  kvtest::cluster c(async_with_staleness(2, 0));
  std::atomic<bool> fast_waits{false};
  c.run_workers([&](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> w(3, 0.f), out(3);
    kv.init(9, w);
    if (kv.rank() == 0) {
      kv.push(9, std::vector<float>(3, 4.f)).wait();
      auto p = kv.pull(9, out);
      check_still_pending(p);
      fast_waits = true;
      p.wait();
      CHECK(out == std::vector<float>(3, 4.f));
    } else {
      REQUIRE(wait_for(fast_waits));
      kv.leave();
    }
  });
}

namespace {
// Child mode: worker rank 1 of a dist_async job with staleness 0; inits, meets the barrier,
// then stays until the test kills it (at most a minute).
int child_worker(std::uint16_t port) {
  auto o = async_with_staleness(2, 0);
  o.scheduler_port = port;
  o.rank_hint = 1;
  o.on_worker_death = kvstore::worker_death::leave_group;
  auto* kv = new kvstore::KVStore<kvstore::dist>(o);  // never destroyed: a death, not an exit
  std::vector<float> v(3, 0.f);
  kv->init(9, v);
  kv->barrier();
  std::this_thread::sleep_for(60s);
  _exit(3);
}
}  // namespace

TEST_CASE("staleness: a worker that dies no longer holds the others back" * doctest::timeout(60)) {
  auto o = async_with_staleness(2, 0);
  o.on_worker_death = kvstore::worker_death::leave_group;
  kvtest::cluster c(o);
  const std::string port = std::to_string(c.options().scheduler_port);
  kvtest::child child = kvtest::spawn({self_exe, "--kv-child-worker", port}, kvtest::environment());
  auto w = c.options();
  w.rank_hint = 0;
  {
    kvstore::KVStore<kvstore::dist> kv(w);
    kv.set_barrier_before_exit(false);
    std::vector<float> v(3, 0.f), out(3);
    kv.init(9, v);
    kv.barrier();
    kv.push(9, std::vector<float>(3, 2.f)).wait();
    auto p = kv.pull(9, out);
    check_still_pending(p);
    child.kill();
    const auto start = clock_type::now();
    p.wait();
    CHECK(clock_type::now() - start < 10s);
    CHECK(out == std::vector<float>(3, 2.f));
  }
}

TEST_CASE("bad input: a staleness that is a converted negative number is refused" *
          doctest::timeout(30)) {
  auto o = kvtest::test_options(1, 1, /*sync=*/false);
  o.staleness = static_cast<std::uint64_t>(-1);
  o.scheduler_port = 1;  // never reached: the options are checked first
  CHECK_THROWS_WITH_AS(kvstore::KVStore<kvstore::dist>{o}, doctest::Contains("staleness"),
                       kvstore::error);
  o.role = kvstore::role::server;
  CHECK_THROWS_WITH_AS(kvstore::server{o}, doctest::Contains("staleness"), kvstore::error);
}

int main(int argc, char** argv) {
  self_exe = argv[0];
  if (argc == 3 && std::strcmp(argv[1], "--kv-child-worker") == 0)
    return child_worker(static_cast<std::uint16_t>(std::stoi(argv[2])));
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
