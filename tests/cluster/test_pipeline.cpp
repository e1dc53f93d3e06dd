#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/tcp_bytes.hpp"

#include <kvstore/wire/frame.hpp>  // the size of an acks frame

#include <chrono>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

// Per-key pipelining (dist_options::pipeline_depth, issue 12): back-to-back ops on one key go on
// the wire before the previous one is answered, and still take effect in issue order: a server
// keeps a worker's next push or pull of a key back until its open sync round completes
// (server/parked.hpp). Real loopback TCP; ranks are threads (support/cluster.hpp).

namespace {

using kvstore::dist;
using kvstore::KVStore;
using kvtest::filled;

// Worker w's value of its push i: every element w * 1000 + i + 1.
float value_of(int w, int i) { return static_cast<float>(w * 1000 + i + 1); }

}  // namespace

TEST_CASE("pushes and pulls of one key, none waited for, take effect in issue order" *
          doctest::timeout(120)) {
  for (bool sliced : {false, true}) {
    CAPTURE(sliced);
    auto o = kvtest::test_options(2, 2);
    if (sliced) o.slice_bytes = 64;  // the 256-byte key is cut over both servers
    kvtest::cluster c(o);
    c.run_workers([&](KVStore<dist>& kv) {
      constexpr int n = 64, steps = 12;
      kv.init(5, filled(n, 0.0f));
      kv.barrier();
      // Worker 1 starts late: worker 0's pushes after its first wait on the servers, behind
      // rounds that cannot complete yet, with its pulls between them.
      if (kv.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::vector<std::vector<float>> vals, outs(steps, std::vector<float>(n, -1.0f));
      vals.reserve(steps);
      std::vector<kvstore::op> pulls;
      for (int i = 0; i < steps; ++i) {
        vals.push_back(filled(n, value_of(kv.rank(), i)));
        kv.push(5, std::span<const float>(vals.back()));
        pulls.push_back(kv.pull(5, outs[static_cast<std::size_t>(i)]));
      }
      for (auto& p : pulls) p.wait();
      // No optimizer: a round stores the sum of its pushes; pull i sees round i exactly.
      for (int i = 0; i < steps; ++i)
        REQUIRE(outs[static_cast<std::size_t>(i)] == filled(n, value_of(0, i) + value_of(1, i)));
      CHECK(kv.version(5) == steps);
      kv.barrier();
    });
  }
}

TEST_CASE("back-to-back pushes are on the wire before the first is answered" *
          doctest::timeout(120)) {
  // Worker 1 pushes only after worker 0 has looked: until then no round completes, so without
  // pipelining worker 0 would have one push on the wire, with it all five.
  constexpr int floats = 1024, pushes = 5;
  for (std::uint32_t depth : {16u, 1u}) {
    CAPTURE(depth);
    auto o = kvtest::test_options(2, 1);
    o.pipeline_depth = depth;
    kvtest::cluster c(o);
    c.run_workers([&](KVStore<dist>& kv) {
      kv.init(3, filled(floats, 0.0f));
      kv.barrier();
      const auto v = filled(floats, 1.0f);
      std::vector<kvstore::op> ops;
      if (kv.rank() == 0) {
        const auto before = kvtest::tcp_bytes();
        for (int i = 0; i < pushes; ++i) ops.push_back(kv.push(3, std::span<const float>(v)));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const auto after = kvtest::tcp_bytes();
        const double sent = double(after.sent - before.sent);
        CAPTURE(sent);
        CHECK_FALSE(ops.front().ready());
        if (depth > 1)
          CHECK(sent >= pushes * floats * sizeof(float));
        else
          CHECK(sent < 2 * floats * sizeof(float));
        kv.barrier();
      } else {
        kv.barrier();
        for (int i = 0; i < pushes; ++i) ops.push_back(kv.push(3, std::span<const float>(v)));
      }
      for (auto& p : ops) p.wait();
      std::vector<float> out(floats);
      kv.pull(3, out).wait();
      CHECK(out == filled(floats, 2.0f));
      CHECK(kv.version(3) == pushes);
      kv.barrier();
    });
  }
}

TEST_CASE("dist_async and a single worker: each pull sees exactly the pushes before it" *
          doctest::timeout(120)) {
  for (int workers : {1, 2}) {
    CAPTURE(workers);
    // One worker in dist_sync: every round completes on arrival. Two in dist_async: each push
    // applies on arrival (no optimizer: it is stored), the other worker's keys are its own.
    auto o = kvtest::test_options(workers, 2, /*sync=*/workers == 1);
    kvtest::cluster c(o);
    c.run_workers([&](KVStore<dist>& kv) {
      constexpr int keys = 8, steps = 40;
      const int base = kv.rank() * keys;
      for (int k = 0; k < 2 * keys; ++k) kv.init(k, filled(3, 0.0f));
      kv.barrier();
      std::vector<std::vector<float>> vals, outs(keys * steps, std::vector<float>(3));
      vals.reserve(keys * steps);
      std::vector<kvstore::op> pulls;
      for (int i = 0; i < steps; ++i)
        for (int k = 0; k < keys; ++k) {
          vals.push_back({float(base + k), float(i), float(kv.rank())});
          kv.push(base + k, std::span<const float>(vals.back()), i % 3);
          pulls.push_back(kv.pull(base + k, outs[static_cast<std::size_t>(i * keys + k)], i % 3));
        }
      for (auto& p : pulls) p.wait();
      for (int i = 0; i < steps; ++i)
        for (int k = 0; k < keys; ++k)
          REQUIRE(outs[static_cast<std::size_t>(i * keys + k)] ==
                  std::vector<float>{float(base + k), float(i), float(kv.rank())});
      kv.barrier();
    });
  }
}

TEST_CASE("pushes in flight are answered by few frames: acks merge, every push completes" *
          doctest::timeout(120)) {
  // One worker pushes 2,000 single-float keys back to back. The server answers each push with
  // an ack (wire::acks_header) that its connection merges with the acks queued before it
  // (transport/send_queue.hpp): the worker reads far fewer than 2,000 80-byte answers, and
  // still every op completes and every sum is there.
  auto o = kvtest::test_options(1, 1);
  kvtest::cluster c(o);
  c.run_workers([&](KVStore<dist>& kv) {
    constexpr int keys = 2000;
    for (int k = 0; k < keys; ++k) kv.init(k, filled(1, 0.0f));
    kv.set_optimizer(kvstore::optim::add{});
    kv.barrier();
    std::vector<float> g(keys);
    for (int k = 0; k < keys; ++k) g[static_cast<std::size_t>(k)] = static_cast<float>(k + 1);
    std::vector<kvstore::op> ops;
    ops.reserve(keys);
    const auto before = kvtest::tcp_bytes();
    for (int k = 0; k < keys; ++k)
      ops.push_back(kv.push(k, std::span<const float>(&g[static_cast<std::size_t>(k)], 1)));
    kv.wait_all();
    const auto after = kvtest::tcp_bytes();
    for (auto& p : ops) CHECK(p.ready());
    // This process holds both ends: what the server's socket sent the worker is in `sent` (and
    // again in `received`). The pushes themselves are 84 bytes each; one 80-byte answer per push
    // would add 80 more each way.
    const double per_push = double(after.sent - before.sent) / keys;
    CAPTURE(per_push);
    CHECK(per_push < 84 + 40);
    std::vector<float> out(1);
    for (int k = 0; k < keys; k += 97) {
      kv.pull(k, out).wait();
      CHECK(out[0] == static_cast<float>(k + 1));
    }
  });
}
