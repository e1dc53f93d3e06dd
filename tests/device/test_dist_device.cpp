// KVStore<dist> with device_span values (MXNet's dist_device_sync): 2 workers x 2 servers over
// real loopback TCP (ranks as threads, tests/support/cluster.hpp), each worker with several
// (virtual, on the OMP build) devices. Every device key has a host twin that gets the same values
// through the host calls; the two must agree bit for bit, and both equal the exact sums.
#include <kvstore/device.hpp>  // first: with it, dist.hpp's device_span calls are complete
#include <kvstore/dist.hpp>

#include "device_test_support.hpp"

#include "../support/cluster.hpp"

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace {

using dtest::dev;
using dtest::on;
using kvstore::device_buffer;
using kvstore::device_span;
using kvstore::dist;
using kvstore::errc;
using kvstore::key;
using kvstore::KVStore;

// 2 workers, 2 servers; values above 64 bytes sliced over both servers in 10-float frames, so
// the big keys cross both servers and several frames.
kvstore::dist_options opts() {
  auto o = kvtest::test_options(2, 2);
  o.slice_bytes = 64;
  o.chunk_bytes = 40;
  return o;
}

// Values that are not exact sums of powers of two: any change of summation order shows.
std::vector<float> wiggly(std::size_t n, int seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = (0.1f * static_cast<float>((i * 7 + static_cast<std::size_t>(seed) * 13) % 101) - 3.3f) /
           static_cast<float>(seed + 3);
  return v;
}

// The value rank r's device j pushes in `round`.
std::vector<float> grad(std::size_t n, int rank, int j, int round) {
  return wiggly(n, 100 * round + 10 * rank + j + 1);
}

// What a worker's push of its `k` devices' values is: their sum, left to right.
std::vector<float> worker_sum(std::size_t n, int rank, int k, int round) {
  auto s = grad(n, rank, 0, round);
  for (int j = 1; j < k; ++j) {
    const auto g = grad(n, rank, j, round);
    for (std::size_t i = 0; i < n; ++i) s[i] = s[i] + g[i];
  }
  return s;
}

// A round of dist_sync with no optimizer stores the sum of both workers' pushes (two addends:
// exact in either order).
std::vector<float> round_sum(std::size_t n, int k, int round) {
  auto a = worker_sum(n, 0, k, round);
  const auto b = worker_sum(n, 1, k, round);
  for (std::size_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
  return a;
}

// One worker's k devices' values of one round, on devices dev(0) .. dev(k-1).
struct device_values {
  std::vector<std::vector<float>> host;
  std::vector<device_buffer<float>> bufs;
  std::vector<device_span<const float>> spans;
  std::vector<std::span<const float>> host_spans;

  device_values(std::size_t n, int rank, int k, int round) {
    for (int j = 0; j < k; ++j) host.push_back(grad(n, rank, j, round));
    for (int j = 0; j < k; ++j) {
      bufs.push_back(on(dev(static_cast<std::size_t>(j)), host[static_cast<std::size_t>(j)]));
      spans.push_back(bufs.back().cspan());
      host_spans.push_back(host[static_cast<std::size_t>(j)]);
    }
  }
};

std::vector<float> host_pull(KVStore<dist>& kv, const key& k, std::size_t n) {
  std::vector<float> out(n, -999.f);
  kv.pull(k, std::span<float>(out)).wait();
  return out;
}

}  // namespace

TEST_CASE(
    "dist_sync, 2 workers x 2 servers: several devices' pushes are summed once and equal the host "
    "path; a pull is broadcast to several devices" *
    doctest::timeout(120)) {
  kvtest::cluster c(opts());
  c.run_workers([](KVStore<dist>& kv) {
    const int r = kv.rank();
    for (std::size_t n :
         {std::size_t{3}, std::size_t{1001}}) {  // one server; both, 10-float frames
      CAPTURE(n);
      const std::string dk = "dev" + std::to_string(n), hk = "host" + std::to_string(n);
      const std::vector<float> zero(n, 0.f);
      auto dzero = on(dev(1), zero);
      kv.init(dk, dzero.cspan());  // a device value as init
      kv.init(hk, std::span<const float>(zero));
      CHECK(host_pull(kv, dk, n) == zero);
      for (int round = 1; round <= 4; ++round) {
        CAPTURE(round);
        const int k = round == 1 ? 1 : round == 2 ? 2 : 3;  // one device, then two, then three
        device_values v(n, r, k, round);
        // A priority > 0 takes the devices' high-priority streams.
        auto p = k == 1
                     ? kv.push(dk, v.spans[0], round % 2)
                     : kv.push(dk, std::span<const device_span<const float>>(v.spans), round % 2);
        kv.push(std::span<const key>(std::vector<key>(v.host_spans.size(), hk)),
                std::span<const std::span<const float>>(v.host_spans))
            .wait();  // the host path: one push of the host-summed values
        // Broadcast to three devices, issued before the push is waited for (per-key order).
        device_buffer<float> o0(n, dev(0)), o1(n, dev(1)), o2(n, dev(2));
        auto q = kv.pull(dk, {o0.span(), o1.span(), o2.span()});
        q.wait();
        p.wait();
        const auto want = round_sum(n, k, round);
        const auto host = host_pull(kv, hk, n);
        CHECK(host == want);
        CHECK(o0.to_host() == want);
        CHECK(o1.to_host() == want);
        CHECK(o2.to_host() == want);
        // One device output, and a host pull of the device key: the same value.
        device_buffer<float> one(n, dev(2));
        kv.pull(dk, one.span()).wait();
        CHECK(one.to_host() == host);
        CHECK(host_pull(kv, dk, n) == host);
      }
    }
  });
}

TEST_CASE("dist_sync with an optimizer on the servers: the device path equals the host path" *
          doctest::timeout(120)) {
  kvtest::cluster c(opts());
  c.run_workers([](KVStore<dist>& kv) {
    const int r = kv.rank();
    const std::size_t n = 257;
    const auto w0 = wiggly(n, 7);
    auto dw0 = on(dev(2), w0);
    kv.init("w", dw0.cspan());
    kv.init("w_host", std::span<const float>(w0));
    kv.set_optimizer(
        kvstore::optim::sgd{.learning_rate = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
    std::vector<float> prev = w0;
    for (int round = 1; round <= 5; ++round) {
      CAPTURE(round);
      device_values v(n, r, 3, round);
      kv.push("w", {v.spans[0], v.spans[1], v.spans[2]});
      kv.push("w_host", {v.host_spans[0], v.host_spans[1], v.host_spans[2]}).wait();
      device_buffer<float> o0(n, dev(0)), o1(n, dev(1));
      kv.pull("w", {o0.span(), o1.span()}).wait();
      const auto host = host_pull(kv, "w_host", n);
      CHECK(host != prev);  // the optimizer moved the weights
      CHECK(o0.to_host() == host);
      CHECK(o1.to_host() == host);
      prev = host;
    }
  });
}

TEST_CASE("pushpull, multi-key push and pull (a key named twice is summed), double values" *
          doctest::timeout(120)) {
  kvtest::cluster c(opts());
  c.run_workers<double>([](KVStore<dist, double>& kv) {
    const int r = kv.rank();
    const std::size_t n = 40;  // 320 bytes: sliced over both servers
    std::vector<double> a(n), b(n), zero(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = 0.1 * static_cast<double>(i) + r;       // sum over ranks: 0.2 i + 1
      b[i] = 1e-3 * static_cast<double>(i * i) - r;  // sum: 2e-3 i^2 - 1
    }
    auto da = device_buffer<double>(std::span<const double>(a), dev(0));
    auto db = device_buffer<double>(std::span<const double>(b), dev(1));
    const std::vector<key> ks{"x", "y"};
    const std::array<device_span<const double>, 2> init_vals{da.cspan(), db.cspan()};
    kv.init(std::span<const key>(ks), std::span<const device_span<const double>>(init_vals));
    std::vector<double> got(n);
    kv.pull("x", std::span<double>(got)).wait();
    // rank 0's values are stored
    for (std::size_t i = 0; i < n; ++i) CHECK(got[i] == 0.1 * static_cast<double>(i));

    // pushpull: out gets this round's sum.
    device_buffer<double> out(n, dev(2));
    kv.pushpull("x", da.cspan(), out.span()).wait();
    const auto px = out.to_host();
    for (std::size_t i = 0; i < n; ++i) {
      const double a0 = 0.1 * static_cast<double>(i), a1 = a0 + 1;
      CHECK(px[i] == a0 + a1);
    }
    // Multi-key: "y" named twice (its two values summed on the device, pushed once), "x" once.
    const std::vector<key> ks3{"y", "x", "y"};
    const std::array<device_span<const double>, 3> vals{db.cspan(), da.cspan(), da.cspan()};
    kv.push(std::span<const key>(ks3), std::span<const device_span<const double>>(vals)).wait();
    device_buffer<double> ox(n, dev(1)), oy0(n, dev(0)), oy1(n, dev(2));
    const std::vector<key> ks_pull{"x", "y", "y"};
    const std::array<device_span<double>, 3> outs{ox.span(), oy0.span(), oy1.span()};
    kv.pull(std::span<const key>(ks_pull), std::span<const device_span<double>>(outs)).wait();
    const auto gx = ox.to_host(), gy0 = oy0.to_host(), gy1 = oy1.to_host();
    for (std::size_t i = 0; i < n; ++i) {
      const double a0 = 0.1 * static_cast<double>(i), a1 = a0 + 1;
      const double b0 = 1e-3 * static_cast<double>(i * i), b1 = b0 - 1;
      CHECK(gx[i] == a0 + a1);
      const double y = (b0 + a0) + (b1 + a1);  // each worker's (b + a), then the two workers
      CHECK(gy0[i] == y);
      CHECK(gy1[i] == y);
    }
  });
}

TEST_CASE(
    "errors at the call name the key and the device, and change nothing: the next round is "
    "exact" *
    doctest::timeout(120)) {
  kvtest::cluster c(opts());
  c.run_workers([](KVStore<dist>& kv) {
    const std::size_t n = 20;
    const std::vector<float> v0(n, 1.f);
    kv.init("k", std::span<const float>(v0));
    auto good = on(dev(0), std::vector<float>(n, 2.f));
    auto other = on(dev(1), std::vector<float>(n, 2.f));
    auto short_buf = on(dev(1), std::vector<float>(n - 1, 2.f));
    const std::string d0 = std::to_string(dev(0)), d1 = std::to_string(dev(1));

    if (dtest::devices().size() > 1)  // memory of device 1 stated as device 0's
      dtest::expect_error(
          [&] {
            kv.push("k", device_span<const float>{other.data(), n, dev(0)});
          },
          errc::invalid_argument, {"push", "\"k\"", "device " + d0, "on device " + d1});
    dtest::expect_error(
        [&] {
          kv.push("k", device_span<const float>{good.data(), n, -1});
        },
        errc::invalid_argument, {"push", "\"k\"", "device -1", "does not exist"});
    dtest::expect_error(
        [&] {
          kv.push("k", {good.cspan(), short_buf.cspan()});
        },
        errc::size_mismatch, {"push", "\"k\"", "device " + d1, "size 19", "20"});
    dtest::expect_error(
        [&] {
          kv.pull("k", {good.span(), short_buf.span()});
        },
        errc::size_mismatch, {"pull", "\"k\"", "device " + d1});
    dtest::expect_error([&] { kv.pushpull("k", good.cspan(), short_buf.span()); },
                        errc::size_mismatch, {"pushpull", "\"k\"", "device " + d1});
    dtest::expect_error([&] { kv.push("nope", good.cspan()); }, errc::unknown_key,
                        {"push", "\"nope\"", "never inited"});
    dtest::expect_error([&] { kv.push("k", std::span<const device_span<const float>>()); },
                        errc::invalid_argument, {"\"k\"", "no values"});
    dtest::expect_error([&] { kv.init("k", good.cspan()); }, errc::already_inited,
                        {"\"k\"", "twice"});
    // A multi-key push with one bad key pushes none of them.
    const std::vector<key> ks{"k", "nope"};
    const std::array<device_span<const float>, 2> vs{good.cspan(), good.cspan()};
    dtest::expect_error(
        [&] { kv.push(std::span<const key>(ks), std::span<const device_span<const float>>(vs)); },
        errc::unknown_key, {"\"nope\""});
    const std::array<device_span<const float>, 1> one{good.cspan()};
    dtest::expect_error(
        [&] { kv.push(std::span<const key>(ks), std::span<const device_span<const float>>(one)); },
        errc::invalid_argument, {"2 keys with 1 values"});

    // Nothing was sent: the value is init's, and the next round sums exactly one push a worker
    // (a stray push would have completed a round early or made this sum 6).
    CHECK(host_pull(kv, "k", n) == v0);
    kv.push("k", good.cspan()).wait();
    CHECK(host_pull(kv, "k", n) == std::vector<float>(n, 4.f));
  });
}
