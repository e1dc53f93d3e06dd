#include <kvstore/client/batch.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/tcp_bytes.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

// Multi-key calls of many small keys (issue 12): batched frames over real loopback TCP, exact
// sums, per-key order between batched and one-key ops, keys named twice, mixed with big and
// compressed keys, and a bad key that sends nothing. Ranks are threads (support/cluster.hpp).

namespace {

using kvstore::dist;
using kvstore::errc;
using kvstore::KVStore;
using kvtest::expect_error;
using kvtest::filled;

// Keys [first, first + n), and one buffer per key from `values` (each key its own span).
struct many {
  std::vector<kvstore::key> keys;
  std::vector<std::vector<float>> values;
  std::vector<std::span<const float>> in() const {
    return std::vector<std::span<const float>>(values.begin(), values.end());
  }
  std::vector<std::span<float>> out() {
    return std::vector<std::span<float>>(values.begin(), values.end());
  }
  // The same keys and sizes, every element x.
  many all(float x) const {
    many m = *this;
    for (auto& v : m.values) std::fill(v.begin(), v.end(), x);
    return m;
  }
};
many keys_of(std::int64_t first, std::size_t n, std::size_t len, float v) {
  many m;
  for (std::size_t i = 0; i < n; ++i) {
    m.keys.emplace_back(first + static_cast<std::int64_t>(i));
    m.values.emplace_back(len + i % 3, v + static_cast<float>(i % 5));
  }
  return m;
}

}  // namespace

TEST_CASE(
    "thousands of small keys in one call: exact sums over 2 workers x 2 servers, in few "
    "bytes" *
    doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 2);
  o.chunk_bytes = 4096;  // several frames per server each way, answers in several data frames
  kvtest::cluster c(o);
  constexpr std::size_t n = 20000;
  c.run_workers([&](KVStore<dist>& kv) {
    auto m = keys_of(1'000'000, n, 1, 1.0f);  // 1 to 3 floats each
    kv.init(m.keys, m.in());
    const float r = static_cast<float>(kv.rank());
    for (std::size_t i = 0; i < n; ++i)
      for (auto& x : m.values[i]) x = r + 1 + static_cast<float>(i % 7);
    kv.barrier();
    // The process's sockets, read by rank 0 alone (two threads walking /proc/self/fd at once
    // race on each other's directory descriptors).
    const bool counts = kv.rank() == 0;
    const auto before = counts ? kvtest::tcp_bytes() : kvtest::tcp_traffic{};
    kv.push(m.keys, m.in()).wait();
    const auto after = counts ? kvtest::tcp_bytes() : kvtest::tcp_traffic{};
    auto got = keys_of(1'000'000, n, 1, -1.0f);
    kv.pull(m.keys, got.out()).wait();
    for (std::size_t i = 0; i < n; ++i)
      for (float x : got.values[i]) REQUIRE(x == 3 + 2 * static_cast<float>(i % 7));  // (1 + 2)
    // Both workers' pushes and the servers' reads of them, in this process: one key costs its
    // 24-byte entry and its values, not an 80-byte frame and a response of its own.
    const double per_key =
        double(after.sent + after.received - before.sent - before.received) / (2.0 * n);
    CAPTURE(per_key);
    if (counts) CHECK(per_key < 2 * 60.0);
    kv.barrier();
  });
}

TEST_CASE("per-key order holds between batched and one-key ops on the same keys" *
          doctest::timeout(60)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    kvtest::cluster c(kvtest::test_options(1, 2, sync));
    c.run_workers([&](KVStore<dist>& kv) {
      auto m = keys_of(500, 300, 1, 0.0f);
      kv.init(m.keys, m.in());
      kv.set_optimizer(kvstore::optim::add{});  // w += g: every push counts
      const auto ones = keys_of(500, 300, 1, 0.0f).all(1.0f);
      std::vector<float> one(m.values[7].size(), 10.0f), out7(one.size());
      // Issued back to back, none waited for: one-key push, batched push, one-key pull, batched
      // push, batched pull. Each sees exactly the pushes issued before it.
      kv.push(507, one);
      kv.push(ones.keys, ones.in());
      auto p7 = kv.pull(507, out7);
      kv.push(ones.keys, ones.in(), 5);
      auto got = keys_of(500, 300, 1, -1.0f);
      auto all = kv.pull(m.keys, got.out());
      p7.wait();
      all.wait();
      // Key i starts at i % 5 (keys_of); key 507 is i = 7.
      CHECK(out7 == filled(one.size(), 2 + 10 + 1.0f));
      for (std::size_t i = 0; i < 300; ++i)
        REQUIRE(got.values[i] ==
                filled(got.values[i].size(), static_cast<float>(i % 5) + (i == 7 ? 12.0f : 2.0f)));
      CHECK(kv.version(507) == 3);
      CHECK(kv.version(508) == 2);
    });
  }
}

TEST_CASE(
    "a call mixing small, big, sliced and compressed keys; keys named twice; a bad key "
    "sends nothing" *
    doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 2);
  o.slice_bytes = 256;  // a key of more than 64 floats is sliced over both servers
  kvtest::cluster c(o);
  c.run_workers([&](KVStore<dist>& kv) {
    const float r = static_cast<float>(kv.rank());
    kv.init("small", filled(3, 0.0f));
    kv.init("big", filled(5000, 0.0f));    // past batch_value_bytes: one op of its own
    kv.init("sliced", filled(100, 0.0f));  // two slices
    kv.init("fp16", filled(4, 0.0f),
            kvstore::init_options{.compression = {kvstore::compression::fp16}});
    kv.init(7, filled(1, 0.0f));
    std::vector<kvstore::key> ks{"small", "big", 7, "sliced", "fp16", "small", 7};
    auto a = filled(3, r + 1), b = filled(5000, r + 2), c7 = filled(1, 10 * (r + 1)),
         d = filled(100, r + 3), e = filled(4, 0.5f), a2 = filled(3, 100.0f), c72 = filled(1, 1.0f);
    std::vector<std::span<const float>> in{a, b, c7, d, e, a2, c72};
    kv.push(ks, in).wait();
    std::vector<float> oa(3), ob(5000), o7(1), od(100), oe(4), oa2(3), o72(1);
    std::vector<std::span<float>> out{oa, ob, o7, od, oe, oa2, o72};
    kv.pull(ks, out).wait();
    CHECK(oa == filled(3, 1 + 2 + 200.0f));  // named twice: summed, each output filled
    CHECK(oa2 == oa);
    CHECK(ob == filled(5000, 2 + 3.0f));
    CHECK(o7 == filled(1, 10 + 20 + 2.0f));
    CHECK(o72 == o7);
    CHECK(od == filled(100, 3 + 4.0f));
    CHECK(oe == filled(4, 1.0f));
    kv.barrier();
    // An unknown key or a wrong size: the call throws naming it, and nothing was pushed.
    std::vector<kvstore::key> bad{"small", 7, 999};
    std::vector<std::span<const float>> bin{a, c7, c7};
    expect_error([&] { kv.push(bad, bin); }, errc::unknown_key, {"999"});
    std::vector<kvstore::key> sized{"small", 7};
    std::vector<std::span<const float>> sin{a, a};
    expect_error([&] { kv.push(sized, sin); }, errc::size_mismatch, {"7", "size 3"});
    kv.barrier();
    kv.pull(ks, out).wait();
    CHECK(oa == filled(3, 203.0f));
    CHECK(o7 == filled(1, 32.0f));
    kv.barrier();
  });
}

TEST_CASE(
    "dist_async with bounded staleness: multi-key pulls go key by key and wait as one-key "
    "pulls do" *
    doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 1, /*sync=*/false);
  o.staleness = 0;
  kvtest::cluster c(o);
  c.run_workers([&](KVStore<dist>& kv) {
    auto m = keys_of(10, 50, 1, 0.0f);
    kv.init(m.keys, m.in());
    auto g = keys_of(10, 50, 1, 1.0f);
    kv.push(g.keys, g.in()).wait();
    // Staleness 0: each pull sees both workers' first pushes (it waits for the slower one).
    auto got = keys_of(10, 50, 1, -1.0f);
    kv.pull(m.keys, got.out()).wait();
    for (std::size_t i = 0; i < 50; ++i)
      REQUIRE(got.values[i] == g.values[i]);  // async, no optimizer: a push stores its value
    kv.barrier();
  });
}

TEST_CASE(
    "a call naming a recent call's keys follows its plan, and what changed since is still "
    "checked: buffer sizes, the store's compression, a worker that left" *
    doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(1, 2));
  c.run_workers([&](KVStore<dist>& kv) {
    constexpr std::size_t n = 2000;
    auto m = keys_of(0, n, 1, 0.0f);  // 1 to 3 floats each
    kv.init(m.keys, m.in());
    kv.set_optimizer(kvstore::optim::add{});  // w += g: every push counts
    const auto ones = keys_of(0, n, 1, 0.0f).all(1.0f);
    auto got = keys_of(0, n, 1, -1.0f);
    auto expect = [&](float plus, const std::string& when) {
      kv.pull(m.keys, got.out()).wait();
      CAPTURE(when);
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(got.values[i] == filled(got.values[i].size(), static_cast<float>(i % 5) + plus));
    };
    // The same keys three times: the second call is planned, the third follows the plan. So
    // do the pulls (expect pulls once per check).
    for (int i = 0; i < 3; ++i) kv.push(ones.keys, ones.in()).wait();
    expect(3, "after three pushes");
    expect(3, "pulled again: planned");
    expect(3, "pulled along the pull's plan");
    // The planned keys with one buffer of the wrong size: refused, naming the key, nothing sent.
    auto wrong = ones.in();
    const std::vector<float> four(4, 1.0f);  // keys_of's keys have 1 to 3 floats
    wrong[1234] = four;
    expect_error([&] { kv.push(ones.keys, wrong); }, errc::size_mismatch, {"1234", "size 4"});
    std::vector<std::span<float>> wrong_out = got.out();
    std::vector<float> four_out(4);
    wrong_out[77] = four_out;
    expect_error([&] { kv.pull(m.keys, wrong_out); }, errc::size_mismatch, {"77", "size 4"});
    kv.push(ones.keys, ones.in()).wait();  // planned afresh
    kv.push(ones.keys, ones.in()).wait();  // along that plan
    expect(5, "after a refused push and two more");
    // A compression set since the plan: the planned keys now travel 2-bit, one by one. With
    // threshold 0.5, 0.3 sends 0 (and keeps 0.3 as residual); plain would have added 0.3.
    const auto third = keys_of(0, n, 1, 0.0f).all(0.3f);
    kv.set_gradient_compression({kvstore::compression::two_bit, 0.5f});
    kv.push(ones.keys, third.in()).wait();
    expect(5, "after a 2-bit push of 0.3 (sends 0)");
    kv.push(ones.keys, third.in()).wait();  // the residual 0.6 sends 0.5
    expect(5.5f, "after a second 2-bit push of 0.3");
    kv.set_gradient_compression({kvstore::compression::none});
    kv.push(ones.keys, ones.in()).wait();
    expect(6.5f, "plain again");
    // A worker that left may no longer push the planned keys, and may still pull them.
    kv.leave();
    expect_error([&] { kv.push(ones.keys, ones.in()); }, errc::invalid_argument, {"left"});
    expect(6.5f, "pulled after leaving");
  });
}

TEST_CASE(
    "a followed call of several batches sends them in turn, in order with one-key ops issued "
    "between; a plan holding a big key is followed too" *
    doctest::timeout(120)) {
  kvtest::cluster c(kvtest::test_options(1, 2));
  c.run_workers([&](KVStore<dist>& kv) {
    constexpr std::size_t n = 80000;  // many batches of batch_keys (8,192) each
    auto m = keys_of(0, n, 1, 0.0f);  // 1 to 3 floats each, key i starting at i % 5
    kv.init(m.keys, m.in());
    kv.set_optimizer(kvstore::optim::add{});  // w += g: every push counts
    const auto ones = keys_of(0, n, 1, 0.0f).all(1.0f);
    // Remembered, then planned; the next two follow the plan. Between them, none waited for,
    // a push and a pull of a key in the third batch.
    kv.push(ones.keys, ones.in()).wait();
    kv.push(ones.keys, ones.in()).wait();
    constexpr std::size_t k = 70000;
    std::vector<float> ten(m.values[k].size(), 10.0f), out(ten.size());
    auto first = kv.push(ones.keys, ones.in());
    kv.push(static_cast<std::int64_t>(k), ten);
    auto one = kv.pull(static_cast<std::int64_t>(k), out);
    auto second = kv.push(ones.keys, ones.in());
    first.wait();
    second.wait();
    one.wait();
    CHECK(out == filled(out.size(), 0 + 3 + 10.0f));  // k % 5 == 0; three pushes and ten
    // Pulls: remembered, planned, followed; each sees all four pushes and the ten.
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      auto got = keys_of(0, n, 1, -1.0f);
      kv.pull(m.keys, got.out()).wait();
      for (std::size_t j = 0; j < n; ++j)
        REQUIRE(got.values[j] == filled(got.values[j].size(),
                                        static_cast<float>(j % 5) + 4 + (j == k ? 10.0f : 0.0f)));
    }
    // A list with a big key (past batch_value_bytes: an op of its own) follows its plan as
    // before: its small keys batched, the big one alone.
    auto small = keys_of(200000, 100, 1, 0.0f);
    small.keys.emplace_back(300000);
    small.values.emplace_back(5000, 0.0f);
    kv.init(small.keys, small.in());
    const auto grads = small.all(0.5f);
    for (int i = 0; i < 3; ++i) kv.push(grads.keys, grads.in()).wait();
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      auto got = small.all(-1.0f);
      kv.pull(small.keys, got.out()).wait();
      for (std::size_t j = 0; j < small.keys.size(); ++j)
        REQUIRE(got.values[j] == filled(got.values[j].size(), small.values[j][0] + 1.5f));
    }
  });
}

TEST_CASE(
    "servers with a pool of four serve a push of thousands of keys in runs: the same sums and "
    "versions, and per-key order, in dist_sync and dist_async" *
    doctest::timeout(120)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    auto o = kvtest::test_options(2, 2, sync);
    o.server_threads = 4;  // batch_ops::push's runs need a pool of four at least
    kvtest::cluster c(o);
    constexpr std::size_t n = 12000;  // about 6,000 keys a server: frames of 4,096 keys
    c.run_workers([&](KVStore<dist>& kv) {
      auto m = keys_of(2'000'000, n, 1, 0.0f);
      kv.init(m.keys, m.in());
      kv.set_optimizer(kvstore::optim::add{});  // element-wise: the pool may run it
      const float r = static_cast<float>(kv.rank());
      for (int round = 1; round <= 3; ++round) {
        for (std::size_t i = 0; i < n; ++i)
          for (auto& x : m.values[i]) x = (r + 1) * static_cast<float>(round);
        kv.push(m.keys, m.in());
        // Not waited for: the pull comes after the push on each key's connection.
        auto got = keys_of(2'000'000, n, 1, -1.0f);
        kv.pull(m.keys, got.out()).wait();
        // Key i: its init (i % 5) plus round x (1 + 2) per round so far, in dist_sync; in
        // dist_async at least this worker's own pushes so far.
        const float base_sum = 3.0f * static_cast<float>(round * (round + 1) / 2);
        for (std::size_t i = 0; i < n; ++i)
          for (float x : got.values[i]) {
            const float init = static_cast<float>(i % 5);
            if (sync)
              REQUIRE(x == init + base_sum);
            else
              REQUIRE(x >= init + (r + 1) * static_cast<float>(round * (round + 1) / 2));
          }
        kv.barrier();
      }
      kv.wait_all();
      kv.barrier();
      // Every push of both workers applied once: 3 rounds, or 6 pushes in dist_async.
      auto got = keys_of(2'000'000, n, 1, -1.0f);
      kv.pull(m.keys, got.out()).wait();
      for (std::size_t i = 0; i < n; ++i)
        for (float x : got.values[i]) REQUIRE(x == static_cast<float>(i % 5) + 18.0f);
      CHECK(kv.version(m.keys[n - 1]) == (sync ? 3u : 6u));
    });
  }
}
