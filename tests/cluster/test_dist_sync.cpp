#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"

#include <kvstore/client/partition.hpp>  // detail::partition, which the store uses
#include <kvstore/local.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

// Sync rounds with several workers, async mode, slicing and chunking over several servers, rows
// split over servers, optimizers on the servers, optimizer states across local and dist, server
// commands and num_dead_node. Ranks are threads (tests/support/cluster.hpp).

namespace {

using kvstore::dist;
using kvstore::errc;
using kvstore::KVStore;
using kvtest::expect_error;
using kvtest::filled;
using kvtest::iota;

// Options that slice anything above 64 bytes over all servers and send 10-float chunks.
kvstore::dist_options small_slices(int workers, int servers, bool sync = true) {
  auto o = kvtest::test_options(workers, servers, sync);
  o.slice_bytes = 64;
  o.chunk_bytes = 40;
  return o;
}

std::filesystem::path temp_file(const std::string& name) {
  auto dir =
      std::filesystem::temp_directory_path() / ("kvtest_dist_sync_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

void check_near(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
  }
}

}  // namespace

TEST_CASE(
    "the partition: small values whole on one server, big ones sliced evenly, matrices by whole "
    "rows" *
    doctest::timeout(20)) {
  using kvstore::detail::partition;
  auto whole = partition(5, 16, 0, 4, 3, 64);
  REQUIRE(whole.size() == 1);
  CHECK(whole[0].lo == 0);
  CHECK(whole[0].hi == 16);
  auto sl = partition(5, 1001, 0, 4, 3, 64);
  REQUIRE(sl.size() == 3);
  std::set<int> servers;
  std::uint64_t pos = 0;
  std::vector<std::uint64_t> sorted_lo;
  std::map<std::uint64_t, std::uint64_t> ranges;
  for (auto& s : sl) {
    servers.insert(s.server);
    ranges[s.lo] = s.hi;
    CHECK(s.hi - s.lo >= 333);
    CHECK(s.hi - s.lo <= 334);
  }
  CHECK(servers == std::set<int>{0, 1, 2});
  for (auto [lo, hi] : ranges) {
    CHECK(lo == pos);
    pos = hi;
  }
  CHECK(pos == 1001);
  auto rows = partition(9, 20 * 5, 5, 4, 3, 64);
  REQUIRE(rows.size() == 3);
  for (auto& s : rows) {
    CHECK(s.lo % 5 == 0);
    CHECK(s.hi % 5 == 0);
  }
}

TEST_CASE(
    "dist_sync: 4 workers, 12 rounds, a pull issued right after a push sees that round's sum" *
    doctest::timeout(40)) {
  kvtest::cluster c(small_slices(4, 3));
  c.run_workers([](KVStore<dist>& kv) {
    const float r = static_cast<float>(kv.rank());
    kv.init(1, filled(3, 0.0f));         // whole on one server
    kv.init("big", filled(1001, 0.0f));  // sliced over 3 servers, 10-float chunks
    std::vector<float> small(3), big(1001);
    for (int round = 1; round <= 12; ++round) {
      CAPTURE(round);
      const float f = static_cast<float>(round);
      const auto g1 = filled(3, f * (r + 1));   // sum over ranks: 10 f
      const auto g2 = iota(1001, f * r, 1.0f);  // sum: 6 f + 4 i
      // No wait between push and pull: per-key order makes the pull see this round.
      auto p1 = kv.push(1, g1, round % 3);
      auto p2 = kv.push("big", g2, -round);
      auto q1 = kv.pull(1, small, -round);
      auto q2 = kv.pull("big", big, round);
      q2.wait();
      q1.wait();
      CHECK(p1.ready());
      CHECK(p2.ready());
      CHECK(small == filled(3, 10 * f));
      CHECK(big == iota(1001, 6 * f, 4.0f));
    }
  });
}

TEST_CASE("dist_async with several workers and a sliced key: every push applied once" *
          doctest::timeout(40)) {
  kvtest::cluster c(small_slices(3, 2, /*sync=*/false));
  c.run_workers([](KVStore<dist>& kv) {
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1.0});
    kv.init(4, filled(257, 1000.0f));
    const auto g = iota(257, static_cast<float>(kv.rank() + 1), 0.0f);  // rank+1 everywhere
    std::vector<kvstore::op> ops;
    for (int i = 0; i < 20; ++i) ops.push_back(kv.push(4, g, i));
    for (auto& o : ops) o.wait();
    kv.barrier();
    std::vector<float> out(257);
    kv.pull(4, out).wait();
    CHECK(out == filled(257, 1000.0f - 20 * (1 + 2 + 3)));
    CHECK(kv.type() == "dist_async");
  });
}

TEST_CASE("slicing and chunking round-trip exact values, float and double, with odd sizes" *
          doctest::timeout(40)) {
  for (std::size_t chunk : {std::size_t{8}, std::size_t{12}, std::size_t{4096}}) {
    CAPTURE(chunk);
    auto o = small_slices(2, 3);
    o.chunk_bytes = chunk;
    kvtest::cluster c(o);
    c.run_workers([](KVStore<dist>& kv) {
      const std::size_t n = 5003;
      kv.init(77, iota(n, kv.rank() == 0 ? 0.5f : 99.0f));
      std::vector<float> out(n), out2(n);
      kv.pull(77, {std::span<float>(out), std::span<float>(out2)}).wait();
      CHECK(out == iota(n, 0.5f));
      CHECK(out2 == iota(n, 0.5f));
      kv.push(77, iota(n, static_cast<float>(kv.rank()), 2.0f)).wait();
      kv.pull(77, out).wait();
      CHECK(out == iota(n, 1.0f, 4.0f));
    });
    kvtest::cluster cd(o);  // a job ends when its workers leave: a new one for the doubles
    cd.run_workers<double>([](KVStore<dist, double>& kv) {
      const std::size_t n = 2001;
      kv.init("d", iota<double>(n, 0.25, 0.125));
      const double tiny =
          1.0 / static_cast<double>(1 << 30);  // i + tiny is exact in double, not in float
      kv.push("d", iota<double>(n, kv.rank() == 0 ? tiny : 1.0, 1.0)).wait();
      std::vector<double> out(n);
      kv.pull("d", out).wait();
      CHECK(out == iota<double>(n, 1.0 + tiny, 2.0));
    });
  }
}

TEST_CASE("matrix rows split over servers: push_rows sums duplicates and other workers' rows" *
          doctest::timeout(40)) {
  kvtest::cluster c(small_slices(2, 3));
  c.run_workers([](KVStore<dist>& kv) {
    constexpr std::size_t nrows = 20, rl = 5;
    kv.init("emb", filled(nrows * rl, 0.0f), rl);  // 400 bytes: sliced by rows over 3 servers
    // Rank 0: rows 0, 19, 7, 7 (a duplicate); rank 1: rows 19, 10, 3. Values: row id + 100*rank.
    std::vector<std::int64_t> rows = kv.rank() == 0 ? std::vector<std::int64_t>{0, 19, 7, 7}
                                                    : std::vector<std::int64_t>{19, 10, 3};
    std::vector<float> vals;
    for (auto r : rows)
      for (std::size_t j = 0; j < rl; ++j) vals.push_back(static_cast<float>(r + 100 * kv.rank()));
    kv.push_rows("emb", rows, vals).wait();
    std::vector<float> want(nrows * rl, 0.0f);
    auto set = [&](std::size_t r, float v) {
      for (std::size_t j = 0; j < rl; ++j) want[r * rl + j] = v;
    };
    set(0, 0);
    set(19, 19 + 119);
    set(7, 14);
    set(10, 110);
    set(3, 103);
    std::vector<float> all(nrows * rl);
    kv.pull("emb", all).wait();
    CHECK(all == want);
    std::vector<std::int64_t> ask{19, 3, 0, 10, 7, 19, 12};
    std::vector<float> got(ask.size() * rl, -1.0f);
    kv.pull_rows("emb", ask, got).wait();
    for (std::size_t i = 0; i < ask.size(); ++i)
      for (std::size_t j = 0; j < rl; ++j)
        CHECK(got[i * rl + j] == want[static_cast<std::size_t>(ask[i]) * rl + j]);
    // A round in which a worker pushes rows of only one server still completes everywhere.
    std::vector<std::int64_t> one{static_cast<std::int64_t>(kv.rank())};
    kv.push_rows("emb", one, filled(rl, 1.0f)).wait();
    std::vector<std::int64_t> first2{0, 1};
    std::vector<float> o2(2 * rl);
    kv.pull_rows("emb", first2, o2).wait();
    CHECK(o2 == filled(2 * rl, 1.0f));
  });
}

TEST_CASE("sgd with momentum on the servers: applied once per round to the summed gradient" *
          doctest::timeout(40)) {
  kvtest::cluster c(small_slices(2, 2));
  const kvstore::optim::sgd opt{.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  c.run_workers([&](KVStore<dist>& kv) {
    const std::size_t n = 64;  // 256 bytes: sliced over both servers
    kv.set_optimizer(opt);
    kv.init(3, iota(n, 1.0f));
    std::vector<float> w = iota(n, 1.0f), mom(n, 0.0f), out(n);
    const float lr = 0.1f, mu = 0.9f, wd = 0.01f;
    for (int round = 1; round <= 4; ++round) {
      const auto g = iota(n, static_cast<float>(round * (kv.rank() + 1)), 0.5f);
      kv.push(3, g).wait();
      kv.pull(3, out).wait();
      for (std::size_t i = 0; i < n; ++i) {
        const float sum = static_cast<float>(round * 3) + 2 * 0.5f * static_cast<float>(i);
        const float gg = sum + wd * w[i];
        mom[i] = mu * mom[i] - lr * gg;
        w[i] += mom[i];
      }
      CAPTURE(round);
      check_near(out, w);
    }
  });
}

TEST_CASE("adam on the servers equals adam in a local store given the summed gradients" *
          doctest::timeout(40)) {
  const kvstore::optim::adam opt{.learning_rate = 0.01, .weight_decay = 0.001};
  const std::size_t n = 40;
  auto grad = [](int round, int rank) {
    return iota(40, 0.1f * static_cast<float>(round + rank), -0.03f);
  };
  // Local reference: each round pushes both workers' gradients (summed by the store).
  std::vector<std::vector<float>> want;
  {
    KVStore<kvstore::local> lk;
    lk.set_optimizer(opt);
    lk.init(8, iota(n, -1.0f, 0.05f));
    for (int round = 0; round < 5; ++round) {
      auto a = grad(round, 0), b = grad(round, 1);
      lk.push(8, {std::span<const float>(a), std::span<const float>(b)}).wait();
      std::vector<float> w(n);
      lk.pull(8, w).wait();
      want.push_back(w);
    }
  }
  kvtest::cluster c(small_slices(2, 2));
  c.run_workers([&](KVStore<dist>& kv) {
    kv.set_optimizer(opt);
    kv.init(8, iota(n, -1.0f, 0.05f));
    for (int round = 0; round < 5; ++round) {
      kv.push(8, grad(round, kv.rank())).wait();
      std::vector<float> w(n);
      kv.pull(8, w).wait();
      CAPTURE(round);
      check_near(w, want[static_cast<std::size_t>(round)]);
    }
  });
}

TEST_CASE(
    "optimizer states: a local store's file loads into dist and a dist file into a local store" *
    doctest::timeout(60)) {
  const kvstore::optim::adam opt{.learning_rate = 0.05};
  const std::size_t n = 30;  // key 2 (120 bytes) is sliced over both servers; "b" is whole
  auto g = [](int step, std::size_t size, float base) {
    return iota(size, base * static_cast<float>(step + 1), 0.25f);
  };
  const auto w0 = iota(n, 1.0f), b0 = filled(3, 2.0f);

  // The reference run: three steps in one local store, states saved after two.
  const auto lfile = temp_file("local.states");
  std::vector<float> w2(n), b2(3), w3(n), b3(3);
  {
    KVStore<kvstore::local> lk;
    lk.set_optimizer(opt);
    lk.init(2, w0);
    lk.init("b", b0);
    for (int s = 0; s < 2; ++s) {
      lk.push(2, g(s, n, 1.0f)).wait();
      lk.push("b", g(s, 3, -2.0f)).wait();
    }
    lk.pull(2, w2).wait();
    lk.pull("b", b2).wait();
    lk.save_optimizer_states(lfile);
    lk.push(2, g(2, n, 1.0f)).wait();
    lk.push("b", g(2, 3, -2.0f)).wait();
    lk.pull(2, w3).wait();
    lk.pull("b", b3).wait();
  }

  SUBCASE("local file into dist") {
    kvtest::cluster c(small_slices(2, 2));
    c.run_workers([&](KVStore<dist>& kv) {
      kv.set_optimizer(opt);
      kv.init(2, w2);
      kv.init("b", b2);
      kv.load_optimizer_states(lfile);
      kv.barrier();  // every server has its part before anyone pushes
      // The third step's gradient, half from each worker (exact halves: multiples of 0.25).
      auto half = [](std::vector<float> v) {
        for (auto& x : v) x /= 2;
        return v;
      };
      kv.push(2, half(g(2, n, 1.0f))).wait();
      kv.push("b", half(g(2, 3, -2.0f))).wait();
      std::vector<float> w(n), b(3);
      kv.pull(2, w).wait();
      kv.pull("b", b).wait();
      check_near(w, w3);
      check_near(b, b3);
    });
  }

  SUBCASE("dist file into a local store, and back into dist") {
    const auto dfile = temp_file("dist.states");
    std::vector<float> dw2(n), dw3(n), db3(3);
    {
      kvtest::cluster c(small_slices(2, 2));
      c.run_workers([&](KVStore<dist>& kv) {
        kv.set_optimizer(opt);
        kv.init(2, w0);
        kv.init("b", b0);
        for (int s = 0; s < 2; ++s) {
          // Worker 0 pushes the whole gradient, worker 1 zeros: the sum is the local one.
          const float k = kv.rank() == 0 ? 1.0f : 0.0f;
          auto gw = g(s, n, 1.0f), gb = g(s, 3, -2.0f);
          for (auto& x : gw) x *= k;
          for (auto& x : gb) x *= k;
          kv.push(2, gw).wait();
          kv.push("b", gb).wait();
        }
        std::vector<float> w(n);
        kv.pull(2, w).wait();
        check_near(w, w2);
        if (kv.rank() == 0) {
          kv.save_optimizer_states(dfile);
          dw2 = w;
        }
        kv.barrier();
        auto gw = g(2, n, 1.0f), gb = g(2, 3, -2.0f);
        if (kv.rank() == 1) {
          gw.assign(n, 0.0f);
          gb.assign(3, 0.0f);
        }
        kv.push(2, gw).wait();
        kv.push("b", gb).wait();
        if (kv.rank() == 0) {
          kv.pull(2, dw3).wait();
          kv.pull("b", db3).wait();
        }
      });
    }
    check_near(dw3, w3);
    check_near(db3, b3);
    // The dist file continues in a local store exactly as the dist job did.
    KVStore<kvstore::local> lk;
    lk.set_optimizer(opt);
    lk.init(2, dw2);
    lk.init("b", b2);
    lk.load_optimizer_states(dfile);
    lk.push(2, g(2, n, 1.0f)).wait();
    lk.push("b", g(2, 3, -2.0f)).wait();
    std::vector<float> w(n), b(3);
    lk.pull(2, w).wait();
    lk.pull("b", b).wait();
    check_near(w, w3);
    check_near(b, b3);
    // Without the states the next step differs: the states carried real information.
    KVStore<kvstore::local> fresh;
    fresh.set_optimizer(opt);
    fresh.init(2, dw2);
    fresh.push(2, g(2, n, 1.0f)).wait();
    fresh.pull(2, w).wait();
    CHECK(std::abs(w[0] - w3[0]) > 1e-4f);
    // A file naming a key the store lacks is refused, naming the key.
    KVStore<kvstore::local> other;
    other.set_optimizer(opt);
    other.init(2, dw2);
    expect_error([&] { other.load_optimizer_states(dfile); }, errc::unknown_key, {"\"b\""});
  }
  std::filesystem::remove_all(lfile.parent_path());
}

namespace {
// A scheduler and servers whose command hooks are registered before they run.
struct hooked_cluster {
  explicit hooked_cluster(kvstore::dist_options o) : opts(o) {
    auto sched_opts = opts;
    sched_opts.role = kvstore::role::scheduler;
    sched = std::make_unique<kvstore::node_loop>(sched_opts);
    opts.scheduler_port = sched->port();
    for (int s = 0; s < opts.num_servers; ++s) {
      auto so = opts;
      so.role = kvstore::role::server;
      so.rank_hint = s;
      servers.push_back(std::make_unique<kvstore::node_loop>(so));
      auto* sp = servers.back().get();
      sp->on_command([this, sp](int head, std::string_view body) {
        if (head == 99) throw std::runtime_error("head 99 is refused");
        std::lock_guard lk(m);
        calls.push_back({sp->rank(), head, std::string(body)});
      });
    }
    threads.emplace_back([this] { quietly([&] { sched->run(); }); });
    for (auto& s : servers) threads.emplace_back([p = s.get()] { quietly([&] { p->run(); }); });
  }
  ~hooked_cluster() {
    for (auto& s : servers) s->stop();
    sched->stop();
    for (auto& t : threads) t.join();
  }
  static void quietly(const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      MESSAGE("node ended with: " << e.what());
    }
  }
  struct call {
    int server, head;
    std::string body;
    bool operator<(const call& o) const {
      return std::tie(server, head, body) < std::tie(o.server, o.head, o.body);
    }
    bool operator==(const call& o) const = default;
  };
  kvstore::dist_options opts;
  std::unique_ptr<kvstore::node_loop> sched;
  std::vector<std::unique_ptr<kvstore::node_loop>> servers;
  std::vector<std::thread> threads;
  std::mutex m;
  std::vector<call> calls;
};
}  // namespace

TEST_CASE("send_command_to_servers runs every server's on_command hook before it returns" *
          doctest::timeout(30)) {
  hooked_cluster hc(kvtest::test_options(1, 3));
  auto o = hc.opts;
  o.role = kvstore::role::worker;
  {
    KVStore<dist> kv(o);
    const std::string body("lr=0.5\0tail", 11);  // bytes, not a C string
    kv.send_command_to_servers(7, body);
    {
      std::lock_guard lk(hc.m);
      std::multiset<hooked_cluster::call> got(hc.calls.begin(), hc.calls.end());
      std::multiset<hooked_cluster::call> want{{0, 7, body}, {1, 7, body}, {2, 7, body}};
      CHECK(got == want);
    }
    kv.send_command_to_servers(-3, "");
    {
      std::lock_guard lk(hc.m);
      REQUIRE(hc.calls.size() == 6);
      for (std::size_t i = 3; i < 6; ++i) {
        CHECK(hc.calls[i].head == -3);
        CHECK(hc.calls[i].body.empty());
      }
    }
#ifndef __SANITIZE_THREAD__
    // A hook that throws is a kvstore::error for the worker, naming the server and the reason.
    // (Not under TSan: an exception_ptr made on the io thread and released there after the worker
    // read it is a false positive, libstdc++'s refcount being uninstrumented.)
    expect_error([&] { kv.send_command_to_servers(99, "x"); }, errc::server_error,
                 {"head 99 is refused", "server"});
#endif
    // The servers still serve.
    kv.init(1, filled(2, 3.0f));
    std::vector<float> out(2);
    kv.pull(1, out).wait();
    CHECK(out == filled(2, 3.0f));
  }
#ifndef __SANITIZE_THREAD__
  // A server without a hook refuses the command with an error, not a hang.
  kvtest::cluster plain(kvtest::test_options(1, 1));
  plain.run_workers([](KVStore<dist>& kv) {
    expect_error([&] { kv.send_command_to_servers(1, "x"); }, errc::unsupported, {"on_command"});
  });
#endif
}

TEST_CASE("num_dead_node counts MXNet's node groups, and a stopped server counts as dead" *
          doctest::timeout(30)) {
  kvtest::cluster c(kvtest::test_options(2, 2));
  std::atomic<int> phase{0};
  c.run_workers([&](KVStore<dist>& kv) {
    for (int group : {1, 2, 4, 6, 7}) {
      CAPTURE(group);
      CHECK(kv.num_dead_node(group, 60) == 0);
    }
    kv.barrier();
    if (kv.rank() == 0) {
      c.server(1).stop();
      // The scheduler learns at once (the connection closes); allow a few heartbeats.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (kv.num_dead_node(2, 60) == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      phase = 1;
    }
    while (phase == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(kv.num_dead_node(2, 60) == 1);
    CHECK(kv.num_dead_node(4, 60) == 0);
    CHECK(kv.num_dead_node(1, 60) == 0);
    CHECK(kv.num_dead_node(6, 60) == 1);
    CHECK(kv.num_dead_node(7, 60) == 1);
    kv.barrier();  // the scheduler and the workers are fine
  });
}

// The server may answer a push before the worker's sendmsg that wrote it has returned. An op must
// not complete until then: a caller frees its buffer as soon as the op is done, and under ASan
// and TSan (which run this test in CI) the sendmsg interceptors read the buffers after the
// syscall. Before the fix ASan reported a heap-use-after-free here within a few hundred pushes.
TEST_CASE("a pushed buffer freed as soon as its op is done is never read again" *
          doctest::timeout(120)) {
  kvtest::cluster c(kvtest::test_options(2, 1, /*sync=*/false));
  c.run_workers([](kvstore::KVStore<kvstore::dist>& kv) {
    kv.init(1, std::vector<float>(10, 0.0f));
    for (int round = 0; round < 1500; ++round) {
      std::vector<std::pair<kvstore::op, std::unique_ptr<std::vector<float>>>> in_flight;
      for (int j = 0; j < 2; ++j) {
        auto value = std::make_unique<std::vector<float>>(10, static_cast<float>(j + 1));
        auto o = kv.push(1, std::span<const float>(*value));
        in_flight.emplace_back(std::move(o), std::move(value));
      }
      for (auto& f : in_flight) f.first.wait();
      in_flight.clear();  // frees the buffers at once
    }
    std::vector<float> out(10);
    kv.pull(1, out).wait();
    CHECK((out == std::vector<float>(10, 1.0f) || out == std::vector<float>(10, 2.0f)));
  });
}
