// compat/bigdl.hpp over real loopback TCP, ranks as threads of this process, each worker's store
// serving its own shard (colocated): BigDL's chunks, the exact values of one iteration in each
// compression (the sum of the nodes' gradients, the full-precision weight partition beside the
// compressed local copies), chunks routed to their owners over several iterations, empty
// partitions, and the errors of bad input.
#include <kvstore/compat/bigdl.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace bigdl = kvstore::compat::bigdl;
using kvstore::dist;
using kvstore::errc;
using kvstore::KVStore;
using kvtest::expect_error;
using kvtest::filled;

namespace {

// A colocated dist_sync job of `workers` threads, each its own server.
kvstore::dist_options colocated(int workers) {
  auto o = kvtest::test_options(workers, workers);
  o.colocated = true;
  return o;
}

// What the wire makes of 0.1f in each compression.
float over_the_wire(bigdl::compress c, float x) {
  if (c == bigdl::compress::none) return x;
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if (c == bigdl::compress::fp16)
    u &= 0xFFFF0000u;  // BigDL's fp16: the high 16 bits
  else
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;  // bf16, round to nearest even
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}

}  // namespace

TEST_CASE("chunk_of: BigDL's chunks, exact" * doctest::timeout(10)) {
  CHECK(bigdl::chunk_of(0, 3, 10) == bigdl::partition_info{0, 0, 4});
  CHECK(bigdl::chunk_of(1, 3, 10) == bigdl::partition_info{1, 4, 3});
  CHECK(bigdl::chunk_of(2, 3, 10) == bigdl::partition_info{2, 7, 3});
  CHECK(bigdl::chunk_of(0, 4, 2) == bigdl::partition_info{0, 0, 1});
  CHECK(bigdl::chunk_of(1, 4, 2) == bigdl::partition_info{1, 1, 1});
  CHECK(bigdl::chunk_of(2, 4, 2) == bigdl::partition_info{2, 2, 0});
  CHECK(bigdl::chunk_of(3, 4, 2) == bigdl::partition_info{3, 2, 0});
  expect_error([] { (void)bigdl::chunk_of(3, 3, 10); }, errc::invalid_argument,
               {"chunk_of", "partition 3 of 3"});
  expect_error([] { (void)bigdl::chunk_of(0, 0, 10); }, errc::invalid_argument, {"of 0"});
  expect_error([] { (void)bigdl::chunk_of(-1, 2, 10); }, errc::invalid_argument, {"partition -1"});
}

TEST_CASE(
    "three colocated workers each put 0.1f, aggregate_gradient_partition(3): fp16 0.099609375, "
    "bf16 0.10009765625, none 0.1; the weight partition keeps full precision, the local copies "
    "hold the compressed value" *
    doctest::timeout(120)) {
  struct want {
    bigdl::compress c;
    float gradient;
  };
  for (want w : {want{bigdl::compress::fp16, 0.099609375f},
                 want{bigdl::compress::bf16, 0.10009765625f}, want{bigdl::compress::none, 0.1f}}) {
    CAPTURE(static_cast<int>(w.c));
    REQUIRE(over_the_wire(w.c, 0.1f) == w.gradient);
    kvtest::cluster cl(colocated(3));
    cl.run_workers([&](KVStore<dist>& kv) {
      CHECK(kv.colocated());
      bigdl::AllReduceParameter<float> p(kv, 7, 3, 10, w.c);
      const auto info = p.init(filled(10, 0.1f));
      CHECK(info == bigdl::chunk_of(kv.rank(), 3, 10));
      CHECK(info.partition_id == kv.rank());
      CHECK(p.weight_partition().size() == info.length);
      for (float x : p.weight_partition()) CHECK(x == 0.1f);  // rank 0's value, full precision

      std::vector<float> local(10);
      p.get_weights(local).wait();
      CHECK(local == filled(10, w.gradient));  // the same rounding as the gradient's

      p.put_gradients(filled(10, 0.1f));
      p.aggregate_gradient_partition(3);
      CHECK(std::vector<float>(p.gradient_partition().begin(), p.gradient_partition().end()) ==
            filled(info.length, w.gradient));

      // The node's optimizer: w -= g. The master keeps every bit, the copies get the wire's.
      const float stepped = 0.1f - w.gradient * 0.5f;
      for (std::size_t i = 0; i < info.length; ++i)
        p.weight_partition()[i] -= p.gradient_partition()[i] * 0.5f;
      p.send_weight_partition();
      p.get_weights(local).wait();
      for (float x : p.weight_partition()) CHECK(x == stepped);
      CHECK(local == filled(10, over_the_wire(w.c, stepped)));
      if (w.c != bigdl::compress::none) CHECK(over_the_wire(w.c, stepped) != stepped);
    });
  }
}

TEST_CASE("init keeps each node's chunk of its own parameter, as BigDL's: the nodes' may differ" *
          doctest::timeout(120)) {
  kvtest::cluster cl(colocated(3));
  cl.run_workers([](KVStore<dist>& kv) {
    const int r = kv.rank();
    for (auto c : {bigdl::compress::none, bigdl::compress::fp16}) {
      CAPTURE(static_cast<int>(c));
      // Node r's parameter: 50 (r + 1) + j; integers below 256 travel exactly in BigDL's fp16.
      bigdl::AllReduceParameter<float> p(kv, c == bigdl::compress::none ? 7 : 8, 3, 11, c);
      std::vector<float> mine(11), local(11);
      for (std::size_t j = 0; j < 11; ++j)
        mine[j] = static_cast<float>(50 * (r + 1)) + static_cast<float>(j);
      const auto info = p.init(mine);
      // The master chunk is this node's own, at full precision.
      for (std::size_t i = 0; i < info.length; ++i)
        CHECK(p.weight_partition()[i] == mine[info.start + i]);
      // Everyone's weights: element j from its owner's parameter (chunks of 4, 4, 3).
      p.get_weights(local).wait();
      for (std::size_t j = 0; j < 11; ++j) {
        const int owner = j < 4 ? 0 : j < 8 ? 1 : 2;
        CHECK(local[j] == static_cast<float>(50 * (owner + 1)) + static_cast<float>(j));
      }
    }
  });
}

TEST_CASE(
    "every chunk reaches its owner and back: gradients summed per chunk, each node's weight "
    "partition lands in everyone's local copy, three iterations" *
    doctest::timeout(120)) {
  kvtest::cluster cl(colocated(3));
  cl.run_workers([](KVStore<dist>& kv) {
    const int r = kv.rank();
    // Small integers travel exactly in BigDL's fp16: every value below is exact.
    bigdl::AllReduceParameter<float> p(kv, 1, 3, 11);
    std::vector<float> initial(11);
    for (std::size_t j = 0; j < 11; ++j) initial[j] = static_cast<float>(j);
    const auto info = p.init(initial);
    CHECK(info == bigdl::chunk_of(r, 3, 11));  // (0, 0, 4), (1, 4, 4), (2, 8, 3)
    std::vector<float> local(11), grad(11);
    for (int it = 1; it <= 3; ++it) {
      CAPTURE(it);
      p.get_weights(local).wait();
      // Every node's local copy: element j is j - 6 * (it - 1) after it - 1 steps of lr 1.
      for (std::size_t j = 0; j < 11; ++j)
        CHECK(local[j] == static_cast<float>(j) - 6.0f * static_cast<float>(it - 1));
      for (std::size_t j = 0; j < 11; ++j) grad[j] = static_cast<float>((r + 1) * 2);
      p.put_gradients(grad);  // 2, 4, 6: summed 12, averaged over 2 "models": 6
      p.aggregate_gradient_partition(2);
      for (float g : p.gradient_partition()) CHECK(g == 6.0f);
      for (std::size_t i = 0; i < info.length; ++i)
        p.weight_partition()[i] -= p.gradient_partition()[i];
      p.send_weight_partition();
    }
    p.get_weights(local).wait();
    for (std::size_t j = 0; j < 11; ++j) CHECK(local[j] == static_cast<float>(j) - 18.0f);
    // One round per iteration on each key, and init's round of the weights.
    CHECK(kv.version(p.gradient_key()) == 3);
    CHECK(kv.version(p.weight_key()) == 4);
  });
}

TEST_CASE(
    "two parameters side by side, and 2 elements over 4 nodes: the empty partitions take part "
    "in every round" *
    doctest::timeout(120)) {
  kvtest::cluster cl(colocated(4));
  cl.run_workers([](KVStore<dist>& kv) {
    const int r = kv.rank();
    bigdl::AllReduceParameter<float> tiny(kv, 2, 4, 2, bigdl::compress::bf16);
    bigdl::AllReduceParameter<float> big(kv, 3, 4, 9, bigdl::compress::none);
    const auto info = tiny.init(std::vector<float>{1.0f, 2.0f});
    CHECK(info == bigdl::chunk_of(r, 4, 2));
    CHECK(tiny.weight_partition().size() == (r < 2 ? 1u : 0u));
    big.init(filled(9, 0.5f));
    std::vector<float> t(2), b(9);
    for (int it = 0; it < 2; ++it) {
      tiny.put_gradients(std::vector<float>{1.0f, 1.0f});
      big.put_gradients(filled(9, 0.25f));
      tiny.aggregate_gradient_partition(1);
      big.aggregate_gradient_partition(4);
      for (float g : tiny.gradient_partition()) CHECK(g == 4.0f);
      for (float g : big.gradient_partition()) CHECK(g == 0.25f);
      for (std::size_t i = 0; i < tiny.weight_partition().size(); ++i)
        tiny.weight_partition()[i] += tiny.gradient_partition()[i];
      for (std::size_t i = 0; i < big.weight_partition().size(); ++i)
        big.weight_partition()[i] -= big.gradient_partition()[i];
      tiny.send_weight_partition();
      big.send_weight_partition();
    }
    tiny.get_weights(t).wait();
    big.get_weights(b).wait();
    CHECK(t == std::vector<float>{9.0f, 10.0f});
    CHECK(b == filled(9, 0.0f));
  });
}

TEST_CASE("bad input: errors name the parameter id and the problem" * doctest::timeout(120)) {
  SUBCASE("size mismatch, calls before init, init twice, avg_numbers, partition_num") {
    kvtest::cluster cl(colocated(2));
    cl.run_workers([](KVStore<dist>& kv) {
      expect_error([&] { bigdl::AllReduceParameter<float> p(kv, 5, 3, 10); },
                   errc::invalid_argument,
                   {"AllReduceParameter 5", "partition_num 3", "2 servers"});
      expect_error([&] { bigdl::AllReduceParameter<float> p(kv, 5, 2, 0); }, errc::invalid_argument,
                   {"AllReduceParameter 5", "size 0"});
      expect_error(
          [&] { bigdl::AllReduceParameter<float> p(kv, 5, 2, 4, static_cast<bigdl::compress>(9)); },
          errc::invalid_argument, {"AllReduceParameter 5", "compress 9"});

      bigdl::AllReduceParameter<float> p(kv, 9, 2, 4);
      std::vector<float> four(4), three(3);
      expect_error([&] { p.get_weights(four); }, errc::unknown_key,
                   {"AllReduceParameter 9", "get_weights", "before init"});
      expect_error([&] { p.put_gradients(four); }, errc::unknown_key,
                   {"AllReduceParameter 9", "put_gradients", "before init"});
      expect_error([&] { p.aggregate_gradient_partition(2); }, errc::unknown_key,
                   {"AllReduceParameter 9", "aggregate_gradient_partition", "before init"});
      expect_error([&] { (void)p.weight_partition(); }, errc::unknown_key,
                   {"AllReduceParameter 9", "weight_partition", "before init"});
      expect_error([&] { (void)p.gradient_partition(); }, errc::unknown_key,
                   {"AllReduceParameter 9", "gradient_partition", "before init"});
      expect_error([&] { p.send_weight_partition(); }, errc::unknown_key,
                   {"AllReduceParameter 9", "send_weight_partition", "before init"});

      expect_error([&] { p.init(three); }, errc::size_mismatch,
                   {"AllReduceParameter 9", "init", "3 elements", "the parameter 4"});
      p.init(filled(4, 1.0f));
      expect_error([&] { p.init(four); }, errc::already_inited,
                   {"AllReduceParameter 9", "init twice"});
      expect_error([&] { p.get_weights(three); }, errc::size_mismatch,
                   {"AllReduceParameter 9", "get_weights", "local has 3 elements"});
      expect_error([&] { p.put_gradients(three); }, errc::size_mismatch,
                   {"AllReduceParameter 9", "put_gradients", "gradients has 3 elements"});
      expect_error([&] { p.aggregate_gradient_partition(0); }, errc::invalid_argument,
                   {"AllReduceParameter 9", "avg_numbers 0"});
      // Nothing was sent by the refused calls: one clean iteration still gives exact values.
      p.put_gradients(filled(4, 1.0f));
      p.aggregate_gradient_partition(2);
      for (float g : p.gradient_partition()) CHECK(g == 1.0f);
      p.send_weight_partition();
      p.get_weights(four).wait();
      CHECK(four == filled(4, 1.0f));
    });
  }
  SUBCASE("a job whose servers are not one per worker") {
    kvtest::cluster cl(kvtest::test_options(2, 1));
    cl.run_workers([](KVStore<dist>& kv) {
      expect_error([&] { bigdl::AllReduceParameter<float> p(kv, 4, 1, 10); },
                   errc::invalid_argument,
                   {"AllReduceParameter 4", "2 workers and 1 servers", "colocated"});
    });
  }
  SUBCASE("a dist_async job") {
    auto o = colocated(2);
    o.sync = false;
    kvtest::cluster cl(o);
    cl.run_workers([](KVStore<dist>& kv) {
      expect_error([&] { bigdl::AllReduceParameter<float> p(kv, 6, 2, 10); },
                   errc::invalid_argument, {"AllReduceParameter 6", "dist_async", "dist_sync"});
    });
  }
}
