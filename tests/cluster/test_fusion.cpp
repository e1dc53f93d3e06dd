#include <kvstore/client/fusion.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/tcp_bytes.hpp"

#include <chrono>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

// One-key pushes of small keys fused across calls (client/fusion.hpp, issue 12): exact sums in
// dist_sync and dist_async, fewer bytes than one frame per push, per-key order with pulls, and
// no key's op waiting for another key's round (answers key by key). Real loopback TCP; ranks are
// threads (support/cluster.hpp).

namespace {

using kvstore::dist;
using kvstore::KVStore;
using kvtest::filled;

constexpr int keys = 300, rounds = 4;

// Every worker pushes each of `keys` single-float keys `rounds` times, one call per push, none
// waited for; returns the bytes this process's sockets moved per push (all workers and
// servers), and checks the sums.
double push_many(kvstore::dist_options o) {
  kvtest::cluster c(o);
  std::vector<double> per_push(static_cast<std::size_t>(o.num_workers));
  c.run_workers([&](KVStore<dist>& kv) {
    const int W = kv.num_workers();
    for (int k = 0; k < keys; ++k) kv.init(k, filled(1, 0.0f));
    kv.set_optimizer(kvstore::optim::add{});  // w += g: every push counts
    kv.barrier();
    // The process's sockets, read by rank 0 alone (two threads walking /proc/self/fd at once
    // race on each other's directory descriptors).
    const bool counts = kv.rank() == 0;
    const auto before = counts ? kvtest::tcp_bytes() : kvtest::tcp_traffic{};
    std::vector<float> g(keys);
    for (int k = 0; k < keys; ++k) g[static_cast<std::size_t>(k)] = static_cast<float>(k % 7 + 1);
    for (int r = 0; r < rounds; ++r)
      for (int k = 0; k < keys; ++k)
        kv.push(k, std::span<const float>(&g[static_cast<std::size_t>(k)], 1));
    kv.wait_all();
    const auto after = counts ? kvtest::tcp_bytes() : kvtest::tcp_traffic{};
    per_push[static_cast<std::size_t>(kv.rank())] =
        double(after.sent + after.received - before.sent - before.received) /
        double(W * keys * rounds);
    kv.barrier();  // dist_async: the other worker's pushes are in too
    std::vector<float> out(1);
    for (int k = 0; k < keys; ++k) {
      kv.pull(k, out).wait();
      REQUIRE(out[0] == static_cast<float>(W * rounds * (k % 7 + 1)));
    }
    kv.barrier();
  });
  return per_push[0];
}

// Two workers and one server, fusion on with `fuse_time`; requests and barriers wait `timeout`.
kvstore::dist_options two_workers_fused(std::chrono::microseconds fuse_time,
                                        std::chrono::milliseconds timeout) {
  auto o = kvtest::test_options(2, 1);
  o.fuse_bytes = 64 << 10;
  o.fuse_time = fuse_time;
  o.request_timeout = timeout;
  o.barrier_timeout = timeout;
  return o;
}

}  // namespace

TEST_CASE("separate small pushes issued together are fused: exact sums, fewer bytes" *
          doctest::timeout(120)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    auto o = kvtest::test_options(2, 2, sync);
    o.fuse_bytes = 0;  // off: one frame per push
    const double alone = push_many(o);
    o.fuse_bytes = 64 << 10;
    o.fuse_time = std::chrono::microseconds(2000);
    const double fused = push_many(o);
    CAPTURE(alone);
    CAPTURE(fused);
    // A push alone costs its 80-byte frame header each way plus its response; fused, its
    // 24-byte entry and its own response. (The bytes are counted in one process, while other
    // traffic is quiet: the barrier before and wait_all after.)
    CHECK(fused < 0.8 * alone);
  }
}

TEST_CASE("a fused key's push waits for its own round only, not for the others in its frame" *
          doctest::timeout(60)) {
  // Worker 0 fuses keys 1 and 2 (key 0 is in flight) and waits for key 1; worker 1 pushes key 2
  // only after a barrier that worker 0 reaches after that wait. Answered per frame, worker 0
  // would wait for key 2's round, which waits for worker 1 at the barrier: a deadlock.
  kvtest::cluster c(two_workers_fused(std::chrono::microseconds(2000), std::chrono::seconds(10)));
  c.run_workers([&](KVStore<dist>& kv) {
    for (int k = 0; k < 3; ++k) kv.init(k, filled(1, 0.0f));
    kv.barrier();
    const float one = 1;
    if (kv.rank() == 0) {
      auto p0 = kv.push(0, std::span<const float>(&one, 1));
      auto p1 = kv.push(1, std::span<const float>(&one, 1));
      auto p2 = kv.push(2, std::span<const float>(&one, 1));
      p1.wait();
      kv.barrier();
      p0.wait();
      p2.wait();
    } else {
      kv.push(0, std::span<const float>(&one, 1));
      kv.push(1, std::span<const float>(&one, 1)).wait();
      kv.barrier();
      kv.push(2, std::span<const float>(&one, 1)).wait();
    }
    kv.wait_all();
    std::vector<float> out(1);
    for (int k = 0; k < 3; ++k) {
      kv.pull(k, out).wait();
      CHECK(out[0] == 2.0f);
    }
    kv.barrier();
  });
}

namespace {

// Two workers, one server, fuse_time 30 s. Worker 0 pushes key 0, which stays in flight (worker
// 1 pushes key 0 only after a barrier), then key 1, which is therefore fused; worker 1's push of
// key 1 waits for it. `hurry(kv, p1)` (worker 0) makes the fused push leave some way and returns
// once p1 is done (or it gave up); the seconds it took are returned. Unless hurry sends it, the
// push leaves only when fuse_time runs out. Both keys end at 2 (one push of 1 from each).
template <class Hurry>
double seconds_to_send_fused_push(Hurry hurry) {
  kvtest::cluster c(two_workers_fused(std::chrono::seconds(30), std::chrono::seconds(60)));
  double took = -1;
  c.run_workers([&](KVStore<dist>& kv) {
    for (int k = 0; k < 3; ++k) kv.init(k, filled(1, 0.0f));
    kv.barrier();
    const float one = 1;
    if (kv.rank() == 0) {
      auto p0 = kv.push(0, std::span<const float>(&one, 1));
      auto p1 = kv.push(1, std::span<const float>(&one, 1));
      const auto t0 = std::chrono::steady_clock::now();
      hurry(kv, p1);
      took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      kv.barrier();
      p0.wait();
      p1.wait();
    } else {
      kv.push(1, std::span<const float>(&one, 1)).wait();
      kv.barrier();
      kv.push(0, std::span<const float>(&one, 1)).wait();
    }
    std::vector<float> out(1);
    for (int k = 0; k < 2; ++k) {
      kv.pull(k, out).wait();
      CHECK(out[0] == 2.0f);
    }
    kv.barrier();
  });
  return took;
}

}  // namespace

TEST_CASE("an op's wait sends the pushes fusion holds back, not after fuse_time" *
          doctest::timeout(120)) {
  // Only the wait on the op itself (op::wait, not wait_all) can send it in time.
  const double took =
      seconds_to_send_fused_push([](KVStore<dist>&, kvstore::op& p1) { p1.wait(); });
  CHECK(took >= 0);
  CHECK(took < 10.0);
}

TEST_CASE("a request to a server sends the pushes fusion holds for it first" *
          doctest::timeout(120)) {
  // Worker 0 does not wait on its fused push: it pulls key 2 from the same server, and that
  // request must send the fused push before it (nothing queued later overtakes a fused push).
  const double took = seconds_to_send_fused_push([](KVStore<dist>& kv, kvstore::op& p1) {
    std::vector<float> got(1, -1.0f);
    auto pull2 = kv.pull(2, got);
    // Polled, not waited on: a wait would send the fused push itself (op::wait).
    const auto t0 = std::chrono::steady_clock::now();
    while (!p1.ready() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    pull2.wait();
    CHECK(got[0] == 0.0f);
  });
  CHECK(took >= 0);
  CHECK(took < 10.0);
}

TEST_CASE("per-key order: a pull issued after fused pushes sees them" * doctest::timeout(60)) {
  auto o = kvtest::test_options(1, 2, /*sync=*/false);
  o.fuse_bytes = 64 << 10;
  o.fuse_time = std::chrono::microseconds(1000);
  kvtest::cluster c(o);
  c.run_workers([&](KVStore<dist>& kv) {
    constexpr int n = 64;
    for (int k = 0; k < n; ++k) kv.init(k, filled(2, 0.0f));
    // dist_async without an optimizer: a push stores its value. Push i of key k stores
    // (k, i); the pull issued right after push i must see exactly it.
    std::vector<std::vector<float>> vals;
    std::vector<std::vector<float>> outs(static_cast<std::size_t>(n) * 5, std::vector<float>(2));
    vals.reserve(static_cast<std::size_t>(n) * 5);
    std::vector<kvstore::op> pulls;
    for (int i = 0; i < 5; ++i)
      for (int k = 0; k < n; ++k) {
        vals.push_back({static_cast<float>(k), static_cast<float>(i)});
        kv.push(k, std::span<const float>(vals.back()));
        pulls.push_back(kv.pull(k, outs[static_cast<std::size_t>(i * n + k)]));
      }
    for (auto& p : pulls) p.wait();
    for (int i = 0; i < 5; ++i)
      for (int k = 0; k < n; ++k)
        REQUIRE(outs[static_cast<std::size_t>(i * n + k)] ==
                std::vector<float>{static_cast<float>(k), static_cast<float>(i)});
  });
}

TEST_CASE("per-key order: pushes of one key back to back stream while other keys' are fused" *
          doctest::timeout(60)) {
  // Key 0 is pushed back to back, each push between pushes of other keys that fuse while the
  // link is busy. A push of key 0 behind one of its own still on the wire streams; one that was
  // fused holds key 0 until answered, so a pull of key 0 never overtakes it (engine
  // pipelined_run). dist_async without an optimizer: a push stores its value.
  auto o = kvtest::test_options(1, 1, /*sync=*/false);
  o.fuse_bytes = 64 << 10;
  o.fuse_time = std::chrono::microseconds(1000);
  kvtest::cluster c(o);
  c.run_workers([&](KVStore<dist>& kv) {
    constexpr int others = 16, n = 400, every = 10;
    for (int k = 0; k <= others; ++k) kv.init(k, filled(1, -1.0f));
    std::vector<float> vals(n);
    for (int i = 0; i < n; ++i) vals[static_cast<std::size_t>(i)] = static_cast<float>(i);
    std::vector<std::vector<float>> outs(n / every, std::vector<float>(1));
    std::vector<kvstore::op> pulls;
    for (int i = 0; i < n; ++i) {
      const std::span<const float> v(&vals[static_cast<std::size_t>(i)], 1);
      kv.push(0, v);
      kv.push(1 + i % others, v);
      if (i % every == every - 1)
        pulls.push_back(kv.pull(0, outs[static_cast<std::size_t>(i / every)]));
    }
    for (auto& p : pulls) p.wait();
    kv.wait_all();
    for (int j = 0; j < n / every; ++j)
      REQUIRE(outs[static_cast<std::size_t>(j)][0] == static_cast<float>(j * every + every - 1));
    std::vector<float> out(1);
    for (int k = 0; k <= others; ++k) {
      kv.pull(k, out).wait();
      const int last = k == 0 ? n - 1 : n - others + (k - 1);  // the last i with 1 + i % 16 == k
      CHECK(out[0] == static_cast<float>(last));
    }
  });
}
