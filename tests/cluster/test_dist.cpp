#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/process.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

// The contract's dist semantics with exact values, ranks as threads (tests/support/cluster.hpp).

namespace {

using kvstore::dist;
using kvstore::errc;
using kvstore::KVStore;
using kvtest::expect_error;
using kvtest::filled;
using kvtest::iota;

}  // namespace

TEST_CASE("type, rank and num_workers; a key pulled after init has rank 0's value" *
          doctest::timeout(30)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    kvtest::cluster c(kvtest::test_options(3, 2, sync));
    std::array<std::atomic<int>, 3> seen{};
    c.run_workers([&](KVStore<dist>& kv) {
      CHECK(kv.type() == (sync ? "dist_sync" : "dist_async"));
      CHECK(kv.num_workers() == 3);
      CHECK(kv.num_servers() == 2);
      REQUIRE(kv.rank() >= 0);
      REQUIRE(kv.rank() < 3);
      seen[static_cast<std::size_t>(kv.rank())]++;
      const float mine = 10.0f * static_cast<float>(kv.rank() + 1);
      auto v = filled(5, mine);
      kv.init(3, v);
      kv.init("fc1.w", iota(4, mine));
      std::vector<float> out(5, -1), named(4, -1);
      kv.pull(3, out).wait();
      kv.pull("fc1.w", named).wait();
      CHECK(out == filled(5, 10.0f));  // rank 0's value, on every worker, right after init
      CHECK(named == iota(4, 10.0f));
    });
    for (auto& s : seen) CHECK(s == 1);  // every rank once
  }
}

TEST_CASE(
    "dist_sync: a round stores the sum of all workers' pushes; pushes of several devices are "
    "summed" *
    doctest::timeout(30)) {
  kvtest::cluster c(kvtest::test_options(2, 2));
  c.run_workers([](KVStore<dist>& kv) {
    const float r = static_cast<float>(kv.rank());
    kv.init(7, filled(6, 100.0f));
    // Round 1: one value each: 1 + 2.
    kv.push(7, filled(6, r + 1)).wait();
    std::vector<float> out(6);
    kv.pull(7, out).wait();
    CHECK(out == filled(6, 3.0f));
    // Round 2: two devices each, summed locally first: (1 + 10) + (2 + 20).
    auto a = filled(6, r + 1), b = filled(6, 10 * (r + 1));
    kv.push(7, {std::span<const float>(a), std::span<const float>(b)}).wait();
    std::vector<float> o1(6), o2(6);
    kv.pull(7, {std::span<float>(o1), std::span<float>(o2)}).wait();
    CHECK(o1 == filled(6, 33.0f));
    CHECK(o2 == filled(6, 33.0f));
    // Element-wise: different values per element survive the sum.
    kv.push(7, iota(6, r, 2.0f)).wait();  // rank 0: 0,2,4..; rank 1: 1,3,5..
    kv.pull(7, out).wait();
    CHECK(out == iota(6, 1.0f, 4.0f));
  });
}

TEST_CASE("push and pull of several keys in one call; pushpull returns the value after this push" *
          doctest::timeout(30)) {
  kvtest::cluster c(kvtest::test_options(2, 3));
  c.run_workers([](KVStore<dist>& kv) {
    const float r = static_cast<float>(kv.rank());
    std::vector<kvstore::key> ks{1, 2, "bias", 40};
    std::vector<std::vector<float>> init{filled(3, 1.0f), filled(1, 2.0f), filled(8, 3.0f),
                                         filled(2, 4.0f)};
    std::vector<std::span<const float>> iv(init.begin(), init.end());
    kv.init(ks, iv);
    std::vector<std::vector<float>> g{filled(3, r + 1), filled(1, 10 * (r + 1)), iota(8, r),
                                      filled(2, -r)};
    std::vector<std::span<const float>> gv(g.begin(), g.end());
    kv.push(ks, gv).wait();
    std::vector<std::vector<float>> out{filled(3, 0.0f), filled(1, 0.0f), filled(8, 0.0f),
                                        filled(2, 0.0f)};
    std::vector<std::span<float>> ov(out.begin(), out.end());
    kv.pull(ks, ov).wait();
    CHECK(out[0] == filled(3, 3.0f));
    CHECK(out[1] == filled(1, 30.0f));
    CHECK(out[2] == iota(8, 1.0f, 2.0f));
    CHECK(out[3] == filled(2, -1.0f));
    // The same key twice in one multi-key push: its values are summed first (one message).
    std::vector<kvstore::key> twice{1, 1};
    auto x = filled(3, 1.0f), y = filled(3, 2.0f);
    std::vector<std::span<const float>> xy{x, y};
    kv.push(twice, xy).wait();
    std::vector<float> o1(3);
    kv.pull(1, o1).wait();
    CHECK(o1 == filled(3, 6.0f));  // (1 + 2) from each of 2 workers
    // pushpull: 5 + 7 from the two workers, seen by both.
    std::vector<float> pp(8, -1);
    kv.pushpull("bias", filled(8, r == 0 ? 5.0f : 7.0f), pp).wait();
    CHECK(pp == filled(8, 12.0f));
  });
}

TEST_CASE("push_rows and pull_rows touch only the named rows" * doctest::timeout(30)) {
  kvtest::cluster c(kvtest::test_options(2, 2));
  c.run_workers([](KVStore<dist>& kv) {
    constexpr std::size_t rows = 6, rl = 3;
    kv.init("emb", iota(rows * rl, 0.0f), rl);  // row i: 3i, 3i+1, 3i+2
    std::vector<std::int64_t> none;
    // Worker 0 pushes rows 1 and 4, worker 1 pushes rows 4 and 5: row 4 gets the sum.
    std::vector<std::int64_t> mine =
        kv.rank() == 0 ? std::vector<std::int64_t>{1, 4} : std::vector<std::int64_t>{4, 5};
    auto vals = filled(2 * rl, kv.rank() == 0 ? 1.0f : 2.0f);
    kv.push_rows("emb", mine, vals).wait();
    std::vector<std::int64_t> ask{5, 0, 4, 1};
    std::vector<float> out(ask.size() * rl, -1);
    kv.pull_rows("emb", ask, out).wait();
    const std::vector<float> want{2, 2, 2, 0, 1, 2, 3, 3, 3, 1, 1, 1};
    CHECK(out == want);
    // A row asked for several times is sent once by its server and copied to each place.
    std::vector<std::int64_t> again{4, 0, 4, 4, 5, 0};
    std::vector<float> twice(again.size() * rl, -1);
    kv.pull_rows("emb", again, twice).wait();
    CHECK(twice == std::vector<float>{3, 3, 3, 0, 1, 2, 3, 3, 3, 3, 3, 3, 2, 2, 2, 0, 1, 2});
    std::vector<float> all(rows * rl);
    kv.pull("emb", all).wait();
    std::vector<float> full = iota(rows * rl, 0.0f);
    for (std::size_t j = 0; j < rl; ++j) {
      full[1 * rl + j] = 1;
      full[4 * rl + j] = 3;
      full[5 * rl + j] = 2;
    }
    CHECK(all == full);
    // Pulling no rows is a no-op that completes.
    std::vector<float> empty;
    kv.pull_rows("emb", none, empty).wait();
  });
}

TEST_CASE("ops on one key take effect in issue order whatever their priorities" *
          doctest::timeout(30)) {
  kvtest::cluster c(kvtest::test_options(1, 2));
  c.run_workers([](KVStore<dist>& kv) {
    kv.init(5, filled(1000, 0.0f));
    constexpr int n = 40;
    std::vector<std::vector<float>> vals, outs;
    for (int i = 0; i < n; ++i) {
      vals.push_back(filled(1000, static_cast<float>(i + 1)));
      outs.push_back(filled(1000, -1.0f));
    }
    std::vector<kvstore::op> ops;
    for (int i = 0; i < n; ++i) {
      // Later ops get alternately far higher and far lower priorities than earlier ones.
      const int prio = (i % 2 ? 1000 : -1000) * (i + 1);
      ops.push_back(kv.push(5, vals[static_cast<std::size_t>(i)], prio));
      ops.push_back(kv.pull(5, outs[static_cast<std::size_t>(i)], -prio));
    }
    kv.wait(5);
    for (auto& o : ops) CHECK(o.ready());
    for (int i = 0; i < n; ++i)
      CHECK(outs[static_cast<std::size_t>(i)] == filled(1000, static_cast<float>(i + 1)));
    // wait_all covers every key.
    kv.init(6, filled(2, 0.0f));
    const auto nine = filled(2, 9.0f);  // alive until the op is done (the buffer rule)
    auto p = kv.push(6, nine, 3);
    std::vector<float> o(2);
    auto q = kv.pull(6, o, -3);
    kv.wait_all();
    CHECK(p.ready());
    CHECK(q.ready());
    CHECK(o == filled(2, 9.0f));
  });
}

TEST_CASE("a frame the caller's thread writes only in part is finished by the io thread, in order" *
          doctest::timeout(60)) {
  // One 48 MiB frame (chunk and slice bounds raised above it) sent while nothing else is in
  // flight goes to the socket from the caller's thread, which takes only what fits in the
  // socket buffer (a few MiB on loopback); the io thread writes the rest, before the small
  // pushes queued meanwhile. Any byte lost, repeated or reordered breaks the values or the
  // framing of every later frame.
  auto o = kvtest::test_options(1, 1);
  o.chunk_bytes = std::size_t{64} << 20;
  o.slice_bytes = std::size_t{64} << 20;
  for (auto spin : {0, 200}) {
    CAPTURE(spin);
    o.wait_spin = std::chrono::microseconds(spin);
    kvtest::cluster c(o);
    c.run_workers([](KVStore<dist>& kv) {
      const std::size_t n = std::size_t{12} << 20;  // 48 MiB of float
      kv.init("big", iota<float>(n, 0.0f));
      kv.init("small", filled(8, 0.0f));
      for (int round = 1; round <= 3; ++round) {
        auto big = iota<float>(n, static_cast<float>(round));
        const auto small = filled(8, static_cast<float>(round));  // alive until the push is done
        auto a = kv.push("big", big);
        auto b = kv.push("small", small);
        a.wait();
        b.wait();
        std::vector<float> out(n), s(8);
        kv.pull("big", out).wait();
        kv.pull("small", s).wait();
        CHECK(out == big);
        CHECK(s == small);
      }
    });
  }
}

TEST_CASE("a barrier counts workers, not frames: a second one from a waiting worker is refused" *
          doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(3, 1));
  std::atomic<bool> last_arrived{false};
  c.run_workers([&](KVStore<dist>& kv) {
    if (kv.rank() == 2) {  // the last worker comes late
      std::this_thread::sleep_for(std::chrono::milliseconds(1'500));
      last_arrived = true;
      kv.barrier();
      return;
    }
    if (kv.rank() == 1) {
      kv.barrier();
      CHECK(last_arrived.load());  // released only once worker 2 came
      return;
    }
    // Worker 0 enters the barrier from two threads at once: one waits, the other is refused
    // with its reason; neither lets the barrier complete without worker 2.
    std::atomic<int> refused{0}, released{0};
    auto enter = [&] {
      try {
        kv.barrier();
        CHECK(last_arrived.load());
        ++released;
      } catch (const kvstore::error& e) {
        CHECK_MESSAGE(
            std::string(e.what()).find("already waiting at this barrier") != std::string::npos,
            e.what());
        ++refused;
      }
    };
    std::thread other(enter);
    enter();
    other.join();
    CHECK(refused == 1);
    CHECK(released == 1);
  });
}

TEST_CASE("dist_async: each push is applied on arrival" * doctest::timeout(30)) {
  kvtest::cluster c(kvtest::test_options(2, 2, /*sync=*/false));
  c.run_workers([](KVStore<dist>& kv) {
    kv.init(1, filled(4, 0.0f));
    // No optimizer: a push replaces the value, so one worker's push is seen at once, without
    // waiting for the other worker.
    if (kv.rank() == 0) {
      kv.push(1, filled(4, 8.0f)).wait();
      std::vector<float> out(4);
      kv.pull(1, out).wait();
      CHECK(out == filled(4, 8.0f));
    }
    kv.barrier();
    // With sgd (lr 0.5) every gradient is applied: 100 - 0.5 * (sum of all pushes).
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5});
    kv.init(2, filled(4, 100.0f));
    for (int i = 0; i < 5; ++i) kv.push(2, filled(4, static_cast<float>(kv.rank() + 1))).wait();
    kv.barrier();
    std::vector<float> out(4);
    kv.pull(2, out).wait();
    CHECK(out == filled(4, 100.0f - 0.5f * 5 * 3));
  });
}

TEST_CASE("a learning-rate schedule runs on the servers at each key's update count" *
          doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(2, 2));
  c.run_workers([](KVStore<dist>& kv) {
    // Key 1 is sliced over both servers (each slice counts its updates), key 2 lives on one.
    const std::size_t big = 300'000;
    kv.init(1, filled(big, 0.0f));
    kv.init(2, filled(4, 0.0f));
    // w -= lr_t * (sum of both workers' gradients = -1): w += lr_t, with MXNet's
    // MultiFactorScheduler(step=[2, 3], factor=0.5) on base 1: 1, 1, 0.5, 0.25, 0.25.
    kv.set_optimizer(kvstore::optim::sgd{
        .learning_rate = 1.0,
        .schedule = kvstore::optim::multifactor_schedule{.steps = {2, 3}, .factor = 0.5}});
    const std::vector<float> g1(big, -0.5f), g2(4, -0.5f);
    std::vector<float> o1(big), o2(4);
    for (int round = 0; round < 5; ++round) kv.push(1, g1);
    for (int round = 0; round < 2; ++round) kv.push(2, g2);
    kv.pull(1, o1).wait();
    kv.pull(2, o2).wait();
    CHECK(o1 == filled(big, 3.0f));  // 1 + 1 + 0.5 + 0.25 + 0.25
    CHECK(o2 == filled(4, 2.0f));    // its own count: 1 + 1
    kv.barrier();
    // A bad schedule is refused at set_optimizer with its reason; the old optimizer stays.
    expect_error(
        [&] {
          kv.set_optimizer(
              kvstore::optim::adam{.schedule = kvstore::optim::factor_schedule{.step = 0}});
        },
        errc::invalid_argument, {"adam: factor_schedule: step must be >= 1"});
    kv.push(2, g2);
    kv.pull(2, o2).wait();
    CHECK(o2 == filled(4, 2.5f));  // t = 3: 0.5
  });
}

TEST_CASE("dist_async: a push sent in several frames is one optimizer step" *
          doctest::timeout(30)) {
  // 3000 floats in frames of 4 KiB: three frames per push, applied one by one on arrival. Adam's
  // bias correction depends on the step count, so a frame counted as a step of its own would
  // move the weights differently from one whole-vector step of the same optimizer here.
  auto o = kvtest::test_options(1, 1, /*sync=*/false);
  o.chunk_bytes = 4096;
  kvtest::cluster c(o);
  c.run_workers([](KVStore<dist>& kv) {
    KVStore<kvstore::local> ref;
    const std::size_t n = 3000;
    const auto w0 = iota<float>(n, 1.0f, 0.5f);
    kv.init(5, w0);
    ref.init(5, w0);
    const kvstore::optim::adam a{.learning_rate = 0.1};
    kv.set_optimizer(a);
    ref.set_optimizer(a);
    for (int i = 0; i < 4; ++i) {
      const auto g = iota<float>(n, static_cast<float>(i), 0.25f);
      kv.push(5, g).wait();
      ref.push(5, g).wait();
    }
    std::vector<float> out(n), want(n);
    kv.pull(5, out).wait();
    ref.pull(5, want).wait();
    CHECK(out == want);
  });
}

TEST_CASE("KVStore<dist, double>: values and sums in double precision" * doctest::timeout(30)) {
  kvtest::cluster c(kvtest::test_options(2, 2));
  c.run_workers<double>([](KVStore<dist, double>& kv) {
    // 1 + 2^-40 is not a float: the value must travel and be summed as double.
    const double tiny = 1.0 / static_cast<double>(std::uint64_t{1} << 40);
    kv.init("w", filled<double>(300, 1.0 + tiny));
    std::vector<double> out(300);
    kv.pull("w", out).wait();
    CHECK(out == filled<double>(300, 1.0 + tiny));
    kv.push("w", filled<double>(300, kv.rank() == 0 ? tiny : 1.0)).wait();
    kv.pull("w", out).wait();
    CHECK(out == filled<double>(300, 1.0 + tiny));
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.25});
    kv.push("w", filled<double>(300, kv.rank() == 0 ? 2.0 : 2.0 + 4 * tiny)).wait();
    kv.pull("w", out).wait();
    CHECK(out == filled<double>(300, (1.0 + tiny) - 0.25 * (4.0 + 4 * tiny)));
    // Rows in double too.
    kv.init(9, iota<double>(8, 0.5), 2);
    std::vector<std::int64_t> rows{3};
    std::vector<double> r(2);
    kv.pull_rows(9, rows, r).wait();
    CHECK(r == std::vector<double>{6.5, 7.5});
  });
}

TEST_CASE("a moved store keeps working; misuse is a kvstore::error naming the key" *
          doctest::timeout(30)) {
  kvtest::cluster c(kvtest::test_options(1, 1));
  c.run_workers([](KVStore<dist>& kv0) {
    KVStore<dist> kv(std::move(kv0));
    kv.init(11, filled(3, 1.0f));
    kv.init("m", iota(6, 0.0f), 2);
    std::vector<float> out(3);
    expect_error([&] { kv.pull(12, out); }, errc::unknown_key, {"12", "never inited"});
    expect_error([&] { kv.push("nope", filled(3, 1.0f)); }, errc::unknown_key, {"\"nope\""});
    expect_error([&] { kv.push(11, filled(4, 1.0f)); }, errc::size_mismatch, {"11", "4", "3"});
    expect_error([&] { kv.init(11, filled(3, 1.0f)); }, errc::already_inited, {"11"});
    std::vector<std::int64_t> bad{0, 3}, neg{-1}, ok{1};
    std::vector<float> two(4), one(2);
    expect_error([&] { kv.pull_rows("m", bad, two); }, errc::row_out_of_range, {"\"m\"", "row 3"});
    expect_error([&] { kv.push_rows("m", neg, one); }, errc::row_out_of_range, {"\"m\"", "row -1"});
    expect_error([&] { kv.pull_rows(11, ok, one); }, errc::not_a_matrix, {"11"});
    expect_error([&] { kv.init(13, filled(5, 1.0f), 2); }, errc::size_mismatch, {"13"});
    // The store still works after every refusal.
    kv.push(11, filled(3, 4.0f)).wait();
    kv.pull(11, out).wait();
    CHECK(out == filled(3, 4.0f));
    // A refused init left no trace: key 13 can be inited properly now.
    kv.init(13, filled(4, 2.0f), 2);
    std::vector<float> o13(4);
    kv.pull(13, o13).wait();
    CHECK(o13 == filled(4, 2.0f));
    // A multi-key init is checked whole before anything is sent: a key named twice, or one
    // inited before, inits none of the others.
    const auto a = filled(2, 5.0f), b = filled(2, 6.0f);
    std::vector<kvstore::key> twice{20, 21, 20}, again{22, 11};
    std::vector<std::span<const float>> v3{a, b, a}, v2{a, b};
    expect_error([&] { kv.init(twice, v3); }, errc::already_inited, {"20", "twice"});
    expect_error([&] { kv.init(again, v2); }, errc::already_inited, {"11"});
    std::vector<float> o2(2);
    for (int k : {20, 21, 22}) expect_error([&] { kv.pull(k, o2); }, errc::unknown_key, {"never"});
    // Then the same keys in one call, sent together: every value stored.
    std::vector<kvstore::key> fresh{20, 21, 22};
    std::vector<std::span<const float>> v{a, b, a};
    kv.init(fresh, v);
    for (int k : {20, 21, 22}) {
      kv.pull(k, o2).wait();
      CHECK(o2 == (k == 21 ? b : a));
    }
  });
}

namespace {
// Polls ops until all are done; returns the indices in the order they completed.
std::vector<int> completion_order(const std::vector<kvstore::op>& ops) {
  std::vector<int> order;
  std::vector<bool> done(ops.size(), false);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (order.size() < ops.size() && std::chrono::steady_clock::now() < until) {
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (!done[i] && ops[i].ready()) {
        done[i] = true;
        order.push_back(static_cast<int>(i));
      }
    std::this_thread::yield();
  }
  for (auto& o : ops) o.wait();
  return order;
}
}  // namespace

TEST_CASE(
    "priorities on the wire: a small high-priority op overtakes a 64 MiB low-priority transfer" *
    doctest::timeout(60)) {
  auto o = kvtest::test_options(1, 1);
  o.chunk_bytes = std::size_t{1} << 20;
  kvtest::cluster c(o);
  c.run_workers([](KVStore<dist>& kv) {
    const std::size_t big_n = (std::size_t{64} << 20) / sizeof(float);
    std::vector<float> big(big_n, 1.0f), big_out(big_n);
    kv.init("big", big);
    kv.init("small", filled(4, 0.0f));
    const auto small = filled(4, 5.0f);
    std::vector<float> small_out(4, -1.0f);
    for (float& x : big) x = 2.0f;

    // Push: the big one first at low priority, then the small push and pull at high priority.
    std::vector<kvstore::op> ops{kv.push("big", big, -100), kv.push("small", small, 100),
                                 kv.pull("small", small_out, 100)};
    auto order = completion_order(ops);
    REQUIRE(order.size() == 3);
    CHECK(order.back() == 0);  // both small ops done before the big push
    CHECK(small_out == filled(4, 5.0f));

    // Pull: the server's answer of 64 chunks is overtaken by a later high-priority answer.
    std::vector<float> small_out2(4, -1.0f);
    std::vector<kvstore::op> pulls{kv.pull("big", big_out, -100),
                                   kv.pull("small", small_out2, 100)};
    order = completion_order(pulls);
    REQUIRE(order.size() == 2);
    CHECK(order.front() == 1);
    CHECK(small_out2 == filled(4, 5.0f));
    CHECK(big_out == big);

    // Equal priorities keep the issue order: the small push now waits for the big one.
    const auto small2 = filled(4, 6.0f);
    std::vector<kvstore::op> fifo{kv.push("big", big, 0), kv.push("small", small2, 0)};
    order = completion_order(fifo);
    REQUIRE(order.size() == 2);
    CHECK(order.front() == 0);
  });
}

TEST_CASE("init with init_options: partition::even puts BigDL's chunk i on server i" *
          doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(2, 3));
  c.run_workers([](KVStore<dist>& kv) {
    std::vector<float> v(10);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
    kv.init(7, v, kvstore::init_options{.partition = kvstore::partition::even});
    // A matrix through the same overload, hashed.
    kv.init(8, filled(6, 1.0f), kvstore::init_options{.row_length = 3});
    kv.push(7, filled(10, 1.0f)).wait();
    std::vector<float> out(10);
    kv.pull(7, out).wait();
    CHECK(out == filled(10, 2.0f));  // dist_sync, no optimizer: the sum of 2 workers
    const std::vector<std::int64_t> row{1};
    std::vector<float> r(3);
    kv.pull_rows(8, row, r).wait();
    CHECK(r == filled(3, 1.0f));
    // A matrix whose size is not whole rows is refused, with the key named.
    expect_error([&] { kv.init(9, filled(5, 1.0f), kvstore::init_options{.row_length = 2}); },
                 errc::size_mismatch, {"9", "row length 2"});
  });
}

TEST_CASE(
    "set_optimizer from rank 0 alone; the same type keeps state; key options; states by the "
    "servers' optimizer" *
    doctest::timeout(90)) {
  kvtest::temp_dir dir("kvstore-optim");
  const std::string saved = dir / "states";
  kvtest::cluster c(kvtest::test_options(2, 2));
  c.run_workers([&](KVStore<dist>& kv) {
    // key 1 is big enough to be sliced over both servers; key 2 lives on one.
    const std::size_t big = 300'000;
    kv.init(1, filled(big, 1.0f));
    kv.init(2, filled(4, 1.0f));
    if (kv.rank() == 0) {  // MXNet's scripts: rank 0 alone sets it; nobody waits at a barrier
      kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.125, .momentum = 0.5});
      kv.set_key_options(2, {.lr_mult = 2.0});
    }
    const std::vector<float> g1(big, 1.0f), g2(4, 1.0f);
    std::vector<float> o1(big), o2(4);
    kv.push(1, g1).wait();  // the round sums 2; mom = -0.25 (key 2: -0.5)
    kv.push(2, g2).wait();
    kv.pull(1, o1).wait();
    kv.pull(2, o2).wait();
    CHECK(o1 == filled(big, 0.75f));
    CHECK(o2 == filled(4, 0.5f));
    // Rank 1 never set an optimizer, yet saves the states for the servers' one.
    if (kv.rank() == 1) kv.save_optimizer_states(saved);
    kv.barrier();
    // Every worker sets the same type with a new learning rate: the momentum carries on.
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.25, .momentum = 0.5});
    kv.push(1, g1).wait();  // mom = 0.5 * -0.25 - 0.25 * 2 = -0.625 (reset: -0.5)
    kv.pull(1, o1).wait();
    CHECK(o1 == filled(big, 0.125f));
    kv.barrier();
    // The saved momentum (-0.25) back: mom = 0.5 * -0.25 - 0.5 = -0.625 (not loaded: -0.8125).
    if (kv.rank() == 1) kv.load_optimizer_states(saved);
    kv.barrier();
    kv.push(1, g1).wait();
    kv.pull(1, o1).wait();
    CHECK(o1 == filled(big, -0.5f));
    kv.barrier();
    // Another type starts fresh and refuses states saved for sgd, naming both.
    if (kv.rank() == 0) kv.set_optimizer(kvstore::optim::add{});
    kv.barrier();
    kv.push(2, g2).wait();  // add: w += 2
    kv.pull(2, o2).wait();
    CHECK(o2 == filled(4, 2.5f));
    if (kv.rank() == 0)
      expect_error([&] { kv.load_optimizer_states(saved); }, errc::invalid_argument,
                   {"\"sgd\"", "\"add\""});
    expect_error([&] { kv.set_key_options(99, {}); }, errc::unknown_key, {"99"});
    expect_error([&] { kv.set_key_options(2, {.wd_mult = 1.0 / 0.0}); }, errc::invalid_argument,
                 {"finite"});
  });
  // The file names the servers' optimizer: a local store with sgd loads it.
  kvstore::KVStore<kvstore::local> local;
  local.init(1, filled(300'000, 0.0f));
  local.init(2, filled(4, 0.0f));
  local.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.1, .momentum = 0.5});
  local.load_optimizer_states(saved);
}
