#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/tcp_bytes.hpp"
#include "support/wire_peer.hpp"

#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/messages.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

// Wire compression between real workers and servers over loopback TCP (ranks as threads,
// tests/support/cluster.hpp): exact values after rounds of fp16, bf16, bf16_trunc and 2-bit
// pushes in dist_sync and dist_async, with and without an optimizer, a key's own compression over
// the store's, keys sliced over several servers in several frames, the bytes the kernel saw
// cross the wire, and bad options.

namespace {

using kvstore::compression;
using kvstore::dist;
using kvstore::errc;
using kvstore::KVStore;
using kvtest::expect_error;
using kvtest::filled;
namespace wire = kvstore::wire;

// Slices anything above 64 bytes over all servers, and frames of 40 bytes of payload (20
// halves, or 144 2-bit codes): a sliced key travels in many frames.
kvstore::dist_options small_frames(int workers, int servers, bool sync = true) {
  auto o = kvtest::test_options(workers, servers, sync);
  o.slice_bytes = 64;
  o.chunk_bytes = 40;
  return o;
}

// What x becomes after a trip in 16-bit encoding c.
float through(compression::kind c, float x) {
  switch (c) {
    case compression::fp16:
      return wire::from_fp16(wire::to_fp16(x));
    case compression::bf16:
      return wire::from_bf16(wire::to_bf16(x));
    case compression::bf16_trunc:
      return wire::from_bf16(wire::to_bf16_trunc(x));
    default:
      return x;
  }
}

// A 2-bit payload's threshold, 0.5f, as the 4 bytes in front of its codes.
std::string two_bit_threshold_half() {
  const float t = 0.5f;
  return std::string(reinterpret_cast<const char*>(&t), sizeof t);
}

}  // namespace

TEST_CASE("dist_sync: the issue's exact values through each 16-bit type, pushed and pulled" *
          doctest::timeout(60)) {
  kvtest::cluster c(small_frames(2, 2));
  c.run_workers([](KVStore<dist>& kv) {
    // 0.1 from each worker: the server sums the decoded values in float, the pull travels
    // compressed again (each sum is exact in its type, so it comes back whole).
    struct expect {
      compression::kind type;
      float one_push, sum_of_two;
    };
    for (const expect e : {expect{compression::bf16_trunc, 0.099609375f, 0.19921875f},
                           expect{compression::bf16, 0.10009765625f, 0.2001953125f},
                           expect{compression::fp16, 0.0999755859375f, 0.199951171875f}}) {
      CAPTURE(int{e.type});
      CHECK(through(e.type, 0.1f) == e.one_push);
      kv.set_gradient_compression({e.type});
      const std::string k = "w" + std::to_string(int{e.type});
      kv.init(k, filled(301, 0.0f));  // 1204 bytes: sliced over both servers, many frames
      kv.push(k, filled(301, 0.1f)).wait();
      std::vector<float> out(301, -1.0f);
      kv.pull(k, out).wait();
      CHECK(out == filled(301, e.sum_of_two));
    }
    // bf16_trunc (BigDL's "fp16"): 70000 travels as 69632.
    kv.set_gradient_compression({compression::bf16_trunc});
    kv.init("big", filled(100, 0.0f));
    kv.push("big", filled(100, 70000.0f)).wait();
    std::vector<float> out(100);
    kv.pull("big", out).wait();
    CHECK(out == filled(100, 2 * 69632.0f));
    kv.set_gradient_compression({compression::none});
    kv.pull("big", out).wait();  // plain: the server's own full-precision value
    CHECK(out == filled(100, 2 * 69632.0f));
  });
}

TEST_CASE("dist_sync, sliced keys: every element exact, with an optimizer and without" *
          doctest::timeout(60)) {
  for (bool with_sgd : {false, true}) {
    CAPTURE(with_sgd);
    kvtest::cluster c(small_frames(2, 3));
    c.run_workers([&](KVStore<dist>& kv) {
      const std::size_t n = 1001;  // over 3 servers, in frames of 20 halves
      if (with_sgd) kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5});
      std::vector<float> init(n);
      for (std::size_t i = 0; i < n; ++i) init[i] = 1.0f + static_cast<float>(i) / 7.0f;
      for (auto type : {compression::fp16, compression::bf16, compression::bf16_trunc}) {
        CAPTURE(int{type});
        const std::string k = "k" + std::to_string(int{type});
        kv.set_gradient_compression({type});
        kv.init(k, init);
        std::vector<float> w = init, out(n);
        for (int round = 1; round <= 3; ++round) {
          CAPTURE(round);
          std::vector<float> g(n);
          for (std::size_t i = 0; i < n; ++i)
            g[i] = 0.01f * static_cast<float>(round) * static_cast<float>(i % 97) +
                   static_cast<float>(kv.rank()) / 3.0f;
          kv.push(k, g).wait();
          kv.pull(k, out).wait();
          // Every worker computes both workers' gradients and the server's float arithmetic.
          for (std::size_t i = 0; i < n; ++i) {
            float sum = 0;
            for (int r = 0; r < 2; ++r) {
              const float gr = 0.01f * static_cast<float>(round) * static_cast<float>(i % 97) +
                               static_cast<float>(r) / 3.0f;
              sum = r == 0 ? through(type, gr) : sum + through(type, gr);
            }
            w[i] = with_sgd ? w[i] - 0.5f * sum : sum;
          }
          bool all = true;
          for (std::size_t i = 0; i < n && all; ++i) {
            CAPTURE(i);
            all = out[i] == through(type, w[i]);
            CHECK(out[i] == through(type, w[i]));
          }
        }
      }
    });
  }
}

TEST_CASE("two_bit with threshold 0.5: 0.3 then 0.3 sends 0 then 0.5, the residual 0.1 carries" *
          doctest::timeout(60)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    kvtest::cluster c(small_frames(2, 2, sync));
    std::atomic<int> done{0};
    c.run_workers([&](KVStore<dist>& kv) {
      const std::size_t n = 300;  // 1200 bytes: over both servers, 2-bit frames of 144
      kv.set_gradient_compression({compression::two_bit, 0.5f});
      kv.init("q", filled(n, 0.0f));
      kv.init("s", filled(n, 8.0f));
      std::vector<float> out(n);
      if (sync) {
        // No optimizer: each round stores the sum of what both workers sent.
        kv.push("q", filled(n, 0.3f)).wait();
        kv.pull("q", out).wait();  // 2-bit pulls travel plain: exact
        CHECK(out == filled(n, 0.0f));
        kv.push("q", filled(n, 0.3f)).wait();
        kv.pull("q", out).wait();
        CHECK(out == filled(n, 1.0f));
        // The residual (0.1) carried: 0.4 more reaches 0.5; without it nothing would be sent.
        kv.push("q", filled(n, 0.4f)).wait();
        kv.pull("q", out).wait();
        CHECK(out == filled(n, 1.0f));
        // Negative, and more than the threshold at once: one threshold per push.
        kv.push("q", filled(n, -1.7f)).wait();
        kv.pull("q", out).wait();
        CHECK(out == filled(n, -1.0f));
      }
      // With sgd (lr 1: w -= g) in both modes: four pushes of 0.3 send 0, 0.5, 0, 0.5.
      kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1.0});
      const auto g = filled(n, 0.3f);  // alive until the pushes are done
      for (int i = 0; i < 4; ++i) kv.push("s", g);
      kv.wait_all();
      kv.barrier();
      kv.pull("s", out).wait();
      CHECK(out == filled(n, 8.0f - 2 * 1.0f));  // 1.0 from each worker
      ++done;
    });
    CHECK(done == 2);
  }
}

TEST_CASE("dist_async: compressed pushes applied as they come, the pulls compressed" *
          doctest::timeout(60)) {
  kvtest::cluster c(small_frames(2, 2, /*sync=*/false));
  c.run_workers([](KVStore<dist>& kv) {
    const std::size_t n = 500;
    kv.set_gradient_compression({compression::bf16_trunc});
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1.0});
    kv.init("a", filled(n, 8.0f));
    // 0.1 travels as 0.099609375 (51/512): any order of 10 updates sums exactly.
    const auto g = filled(n, 0.1f);  // alive until the pushes are done
    for (int i = 0; i < 5; ++i) kv.push("a", g);
    kv.wait_all();
    kv.barrier();
    std::vector<float> out(n);
    kv.set_gradient_compression({compression::none});  // pull the server's full precision
    kv.pull("a", out).wait();
    CHECK(out == filled(n, 8.0f - 10 * 0.099609375f));
    kv.set_gradient_compression({compression::fp16});
    kv.pull("a", out).wait();
    CHECK(out == filled(n, through(compression::fp16, 8.0f - 10 * 0.099609375f)));
  });
}

TEST_CASE("a key's own compression (init_options) wins over the store's" * doctest::timeout(60)) {
  kvtest::cluster c(small_frames(2, 2));
  c.run_workers([](KVStore<dist>& kv) {
    kv.set_gradient_compression({compression::fp16});
    kv.init("own", filled(200, 0.0f),
            kvstore::init_options{.compression = {compression::bf16_trunc}});
    kv.init("store", filled(200, 0.0f));
    kv.init("two", filled(200, 0.0f),
            kvstore::init_options{.compression = {compression::two_bit, 0.25f}});
    kv.push("own", filled(200, 0.1f)).wait();
    kv.push("store", filled(200, 0.1f)).wait();
    kv.push("two", filled(200, 0.3f)).wait();
    std::vector<float> out(200);
    kv.pull("own", out).wait();
    CHECK(out == filled(200, 0.19921875f));  // bf16_trunc both ways
    kv.pull("store", out).wait();
    CHECK(out == filled(200, 0.199951171875f));  // fp16 both ways
    kv.pull("two", out).wait();
    CHECK(out == filled(200, 0.5f));  // 0.25 from each worker; the pull plain
    // Without a store setting, the key's own still applies.
    kv.set_gradient_compression({compression::none});
    kv.push("own", filled(200, 0.1f)).wait();
    kv.pull("own", out).wait();
    CHECK(out == filled(200, 0.19921875f));
  });
}

TEST_CASE("the bytes on the wire: half for 16 bits, a sixteenth for 2 bits" *
          doctest::timeout(90)) {
  auto o = kvtest::test_options(1, 1);
  o.heartbeat_interval = std::chrono::milliseconds(1000);  // little besides the values
  kvtest::cluster c(o);
  c.run_workers([](KVStore<dist>& kv) {
    const std::size_t n = 1 << 20;  // 4 MiB of float
    const int reps = 4;
    kv.init("x", filled(n, 0.0f));
    std::vector<float> g(n), out(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i % 1000) / 1000.0f - 0.5f;
    // Bytes received by every socket of this process (worker and server): once each way.
    auto measure = [&](compression cmp, bool pull) {
      kv.set_gradient_compression(cmp);
      const std::uint64_t before = kvtest::tcp_bytes_received();
      for (int i = 0; i < reps; ++i) {
        if (pull)
          kv.pull("x", out).wait();
        else
          kv.push("x", g).wait();
      }
      return static_cast<double>(kvtest::tcp_bytes_received() - before) / reps;
    };
    const double plain = measure({}, false);
    if (plain == 0) return;  // the kernel does not report TCP_INFO byte counts
    const double payload = 4.0 * n;
    CHECK(plain >= payload);
    CHECK(plain < payload * 1.01);
    for (auto type : {compression::fp16, compression::bf16, compression::bf16_trunc}) {
      CAPTURE(int{type});
      const double push = measure({type}, false), pull = measure({type}, true);
      MESSAGE("16-bit push: " << push << " bytes, pull: " << pull << " bytes, plain " << plain);
      CHECK(push >= payload / 2);
      CHECK(push < payload / 2 * 1.01);
      CHECK(pull >= payload / 2);
      CHECK(pull < payload / 2 * 1.01);
    }
    const double two = measure({compression::two_bit, 0.5f}, false);
    MESSAGE("2-bit push: " << two << " bytes");
    CHECK(two >= payload / 16);
    CHECK(two < payload / 16 * 1.05);
    CHECK(measure({compression::two_bit, 0.5f}, true) >= payload);  // 2-bit pulls are plain
  });
}

TEST_CASE("bad compression options: a kvstore::error naming the option; nothing changes" *
          doctest::timeout(60)) {
  kvtest::cluster c(small_frames(1, 2));
  c.run_workers([](KVStore<dist>& kv) {
    kv.set_gradient_compression({compression::bf16_trunc});
    expect_error([&] { kv.set_gradient_compression({static_cast<compression::kind>(5)}); },
                 errc::invalid_argument, {"set_gradient_compression", "compression type 5"});
    expect_error(
        [&] {
          kv.set_gradient_compression({compression::two_bit, -1.0f});
        },
        errc::invalid_argument, {"set_gradient_compression", "two_bit threshold"});
    expect_error(
        [&] {
          kv.set_gradient_compression({compression::two_bit, NAN});
        },
        errc::invalid_argument, {"two_bit threshold nan"});
    expect_error(
        [&] {
          kv.init("bad", filled(10, 1.0f),
                  kvstore::init_options{.compression = {compression::two_bit, 0.0f}});
        },
        errc::invalid_argument, {"init of key \"bad\"", "two_bit threshold"});
    std::vector<float> out(10);
    expect_error([&] { kv.pull("bad", out).wait(); }, errc::unknown_key, {"bad"});
    // The store's setting is still bf16_trunc.
    kv.init("ok", filled(10, 0.0f));
    kv.push("ok", filled(10, 0.1f)).wait();
    kv.pull("ok", out).wait();
    CHECK(out == filled(10, 0.099609375f));
  });
}

TEST_CASE(
    "a peer's compressed frames: decoded over the wire, refused when malformed, others go on" *
    doctest::timeout(60)) {
  // Worker 1 is scripted: it registers like a worker (its address book brings its credential),
  // proves its rank to the server and speaks the compressed frames by hand.
  auto o = kvtest::test_options(2, 1);
  o.on_worker_death = kvstore::worker_death::leave_group;  // its close: worker 0 goes on alone
  o.dead_timeout = std::chrono::milliseconds(60'000);      // it sends no heartbeats
  kvtest::cluster c(o);
  kvtest::wire_peer sched(c.options().scheduler_port);
  REQUIRE(sched.handshake());
  REQUIRE(sched.send_frame(kvtest::hdr(wire::cmd::reg),
                           wire::encode_registration({kvstore::role::worker, 1, "", 0, 2, 1})));
  auto wo = c.options();
  wo.role = kvstore::role::worker;
  wo.rank_hint = 0;
  KVStore<dist> kv(wo);  // the job gathers
  wire::header h;
  std::string meta;
  do REQUIRE(sched.read_frame(h, meta));
  while (h.command != wire::cmd::address_book);
  const auto book = wire::decode_address_book(meta);
  REQUIRE(book.servers.size() == 1);
  kv.init(5, filled(4, 0.0f));

  kvtest::wire_peer w1(c.server(0).port());
  REQUIRE(w1.handshake());
  REQUIRE(w1.hello(1, book.credential, book.servers[0].id));
  auto frame = [](wire::cmd cmd, std::uint64_t req, wire::encoding e) {
    wire::header f = kvtest::hdr(cmd);
    f.key = 5;
    f.total = 4;
    f.type = wire::dtype::f32;
    f.req_id = req;
    f.flags = (cmd == wire::cmd::push ? wire::flag_last : 0u) | wire::encoding_flags(e);
    return f;
  };
  // A push in fp16 joins worker 0's plain push in one round, summed in float.
  const std::vector<float> g{0.1f, -2.5f, 1000.0f, 0.3f};
  std::string halves(8, '\0');
  wire::encode_16bit(wire::encoding::fp16, g.data(), 4,
                     reinterpret_cast<std::byte*>(halves.data()));
  auto push = frame(wire::cmd::push, 7, wire::encoding::fp16);
  push.aux = 1;
  REQUIRE(w1.send_frame(push, {}, halves));
  kv.push(5, filled(4, 1.0f)).wait();
  std::vector<float> out(4);
  kv.pull(5, out).wait();
  std::vector<float> want(4);
  for (int i = 0; i < 4; ++i) want[i] = 1.0f + through(compression::fp16, g[i]);
  CHECK(out == want);
  REQUIRE(w1.read_frame(h, meta));
  CHECK(h.command == wire::cmd::response);
  CHECK(h.req_id == 7);
  CHECK(h.status == 0);
  // A pull asking for bf16_trunc: one data frame of 4 halves, flagged with the encoding.
  REQUIRE(w1.send_frame(frame(wire::cmd::pull, 8, wire::encoding::bf16_trunc)));
  std::string payload;
  REQUIRE(w1.read_frame(h, meta, &payload));
  CHECK(h.command == wire::cmd::data);
  CHECK(wire::encoding_bits(h.flags) == static_cast<unsigned>(wire::encoding::bf16_trunc));
  REQUIRE(payload.size() == 8);
  std::vector<float> got(4);
  wire::decode_16bit<false>(wire::encoding::bf16_trunc,
                            reinterpret_cast<const std::byte*>(payload.data()), 4, got.data());
  for (int i = 0; i < 4; ++i) CHECK(got[i] == through(compression::bf16_trunc, want[i]));
  // A pull in an encoding the server does not know: an error for that request, nothing closed.
  REQUIRE(w1.send_frame(frame(wire::cmd::pull, 9, static_cast<wire::encoding>(9))));
  REQUIRE(w1.read_frame(h, meta));
  CHECK(h.command == wire::cmd::response);
  CHECK(h.status == static_cast<std::uint32_t>(errc::unsupported));
  CHECK(meta.find("encoding 9") != std::string::npos);
  // Malformed 2-bit codes: a protocol error; the server closes this connection only.
  std::string bad = two_bit_threshold_half() + std::string(1, '\xF7');  // a 3 between codes
  auto push2 = frame(wire::cmd::push, 10, wire::encoding::two_bit);
  push2.aux = 2;
  REQUIRE(w1.send_frame(push2, {}, bad));
  CHECK(w1.closed_by_peer(std::chrono::seconds(5)));
  // Worker 1 is gone from the group; worker 0's rounds go on, exact.
  kv.push(5, filled(4, 2.0f)).wait();
  kv.pull(5, out).wait();
  CHECK(out == filled(4, 2.0f));
  kv.set_barrier_before_exit(false);  // worker 1 meets no barrier
}

TEST_CASE("KVStore<dist, double>: decoded and summed in double, each value rounded once" *
          doctest::timeout(60)) {
  kvtest::cluster c(small_frames(2, 2));
  c.run_workers<double>([](KVStore<dist, double>& kv) {
    const std::size_t n = 100;  // 800 bytes: over both servers
    kv.set_gradient_compression({compression::fp16});
    kv.init("d", std::vector<double>(n, 0.0));
    // Just above the midpoint between two halves by less than a float holds: one rounding
    // goes up; through a float rounded to nearest first it would go down to even.
    const double above = 1.0 + 0x1p-11 + 0x1p-40;
    kv.push("d", std::vector<double>(n, above)).wait();
    std::vector<double> out(n);
    kv.set_gradient_compression({compression::none});
    kv.pull("d", out).wait();
    CHECK(out == std::vector<double>(n, 2 * (1.0 + 0x1p-10)));
    kv.init("q", std::vector<double>(n, 0.0),
            kvstore::init_options{.compression = {compression::two_bit, 0.5f}});
    kv.push("q", std::vector<double>(n, 0.3)).wait();
    kv.push("q", std::vector<double>(n, 0.3)).wait();
    kv.pull("q", out).wait();
    CHECK(out == std::vector<double>(n, 1.0));
  });
}
