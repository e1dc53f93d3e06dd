// Compressed keys (init_options::compression): fp16, bf16 and 2-bit pushes and pulls, held
// against the raw baseline's plain ones; and the encode and decode loops alone, no network.
#include "cases.hpp"

#include <kvstore/wire/encoding.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

namespace kv_bench {

const std::vector<encoding_case> encoding_cases = {
    {"fp16", {kvstore::compression::fp16}, true},
    {"bf16", {kvstore::compression::bf16}, true},
    {"2bit", {kvstore::compression::two_bit, 1.0f}, false},
};

namespace {
// Ids 50000 + 10 z + e (after the many keys); value_of's key of size z is 50000 + z.
int zkey(std::size_t z, std::size_t e) { return static_cast<int>(50000 + 10 * z + e); }
}  // namespace

compressed_kv::compressed_kv(kv_ctx& ctx) : c(ctx) {
  for (std::size_t z = 0; z < c.cfg.compressed_sizes.size(); ++z) {
    const std::size_t n = c.cfg.compressed_sizes[z].bytes / sizeof(float);
    zvals.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) zvals.back()[i] = value_of(c.me, 50000 + z, i);
    zouts.emplace_back(n, 0.f);
    for (std::size_t e = 0; e < encoding_cases.size(); ++e)
      c.kv.init(zkey(z, e), std::span<const float>(zvals.back()),
                kvstore::init_options{.compression = encoding_cases[e].c});
  }
}

// The values are small integers, exact in 16 bits; 2 bits (threshold 1) send +1 per element and
// push, so a round stores W.
void compressed_kv::rep(int rep) {
  const config& cfg = c.cfg;
  for (std::size_t z = 0; z < cfg.compressed_sizes.size(); ++z)
    for (std::size_t e = 0; e < encoding_cases.size(); ++e) {
      const auto& sc = cfg.compressed_sizes[z];
      const auto& ec = encoding_cases[e];
      const std::string tag = ec.name + "_" + std::to_string(sc.bytes);
      const int key = zkey(z, e);
      c.bar.wait();
      auto a = mark();
      for (int i = 0, n = cfg.n("push_" + tag, sc.push_n); i < n; ++i)
        c.kv.push(key, std::span<const float>(zvals[z]));
      c.kv.wait_all();
      auto b = clk::now();
      c.report({"push_" + tag, rep, double(cfg.n("push_" + tag, sc.push_n)),
                double(sc.push_n) * double(sc.bytes), secs(a, b)});
      if (!ec.pull) {
        if (!cfg.want("push_" + tag)) continue;
        c.kv.pull(key, std::span<float>(zouts[z])).wait();
        for (std::size_t i = 0; i < zouts[z].size(); ++i)
          if (zouts[z][i] != static_cast<float>(c.W) * ec.c.threshold) {
            std::fprintf(stderr, "kv_bench worker %d: %s: element %zu is %g, expected %g\n", c.me,
                         tag.c_str(), i, zouts[z][i], double(c.W) * ec.c.threshold);
            ++c.errors;
            break;
          }
        continue;
      }
      c.bar.wait();
      if (cfg.want("pull_" + tag)) std::fill(zouts[z].begin(), zouts[z].end(), -1.f);
      a = mark();
      for (int i = 0, n = cfg.n("pull_" + tag, sc.pull_n); i < n; ++i)
        c.kv.pull(key, std::span<float>(zouts[z]));
      c.kv.wait_all();
      b = clk::now();
      c.report({"pull_" + tag, rep, double(cfg.n("pull_" + tag, sc.pull_n)),
                double(sc.pull_n) * double(sc.bytes), secs(a, b)});
      if (cfg.want("push_" + tag) && cfg.want("pull_" + tag))
        c.check(zouts[z], 50000 + z, ("pull " + tag).c_str());
    }
}

// Each loop over n floats next to memcpy of the same n floats (one thread, arrays out of cache):
// GB/s of float payload, ns per element, and the time relative to memcpy.
std::vector<result> conversion_bench(std::size_t n, int reps) {
  namespace wire = kvstore::wire;
  std::vector<float> src(n), dst(n), acc(n, 0.0f), residual(n, 0.0f);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (auto& x : src) x = d(rng);
  std::vector<std::byte> half(2 * n), two(wire::two_bit_bytes(n));
  wire::encode_16bit(wire::encoding::fp16, src.data(), n, half.data());
  wire::encode_two_bit(src.data(), residual.data(), n, 0.5f, two.data());
  const auto two_view =
      wire::view_payload<float>(wire::encoding::two_bit, std::span<const std::byte>(two));
  struct op {
    const char* name;
    const char* what;
    std::function<void()> run;
  };
  const std::vector<op> ops = {
      {"memcpy", "copy of the floats (the baseline)",
       [&] { std::memcpy(dst.data(), src.data(), n * sizeof(float)); }},
      {"plain_add", "server: sum of plain floats",
       [&] { wire::convert_elements<true>(src.data(), n, acc.data(), [](float x) { return x; }); }},
      {"fp16_encode", "worker push / server pull",
       [&] { wire::encode_16bit(wire::encoding::fp16, src.data(), n, half.data()); }},
      {"fp16_decode_add", "server: sum of a push",
       [&] { wire::decode_16bit<true>(wire::encoding::fp16, half.data(), n, acc.data()); }},
      {"fp16_decode", "worker: a pull's answer",
       [&] { wire::decode_16bit<false>(wire::encoding::fp16, half.data(), n, dst.data()); }},
      {"fp16_encode_port", "the same without F16C",
       [&] {
         wire::convert_elements(src.data(), n, reinterpret_cast<std::uint16_t*>(half.data()),
                                [](float x) { return wire::to_fp16(x); });
       }},
      {"fp16_dec_add_port", "the same without F16C",
       [&] {
         wire::convert_elements<true>(reinterpret_cast<const std::uint16_t*>(half.data()), n,
                                      acc.data(),
                                      [](std::uint16_t h) { return wire::from_fp16(h); });
       }},
      {"bf16_encode", "worker push / server pull",
       [&] { wire::encode_16bit(wire::encoding::bf16, src.data(), n, half.data()); }},
      {"bf16_trunc_encode", "worker push / server pull",
       [&] { wire::encode_16bit(wire::encoding::bf16_trunc, src.data(), n, half.data()); }},
      {"bf16_decode_add", "server: sum of a push",
       [&] { wire::decode_16bit<true>(wire::encoding::bf16, half.data(), n, acc.data()); }},
      {"2bit_encode", "worker push, with the residual",
       [&] { wire::encode_two_bit(src.data(), residual.data(), n, 0.5f, two.data()); }},
      {"2bit_decode_add", "server: sum of a push", [&] { two_view.add_to(0, n, acc.data()); }},
  };
  std::printf(
      "\nConversion loops (wire/encoding.hpp), one thread, %zu floats (%s), median of %d; F16C "
      "%s:\n",
      n, human(n * sizeof(float)).c_str(), reps,
      wire::f16c::available() ? "used for fp16" : "not available");
  std::printf("  %-18s %-32s %10s %10s %10s\n", "loop", "where it runs", "GB/s", "ns/float",
              "x memcpy");
  std::vector<result> out;
  double base = 0;
  for (const auto& o : ops) {
    o.run();  // warm: pages touched
    const double t = median_secs(reps, o.run);
    if (base == 0) base = t;
    const double gbps = double(n) * sizeof(float) / t / 1e9;
    std::printf("  %-18s %-32s %10.2f %10.3f %10.2f\n", o.name, o.what, gbps, t / double(n) * 1e9,
                t / base);
    out.push_back({std::string("convert_") + o.name + "_GBps", gbps, "GB/s",
                   double(n) * sizeof(float) / base / 1e9, base / t, "conversion"});
  }
  // Something of every output is read, so no loop is optimized away.
  volatile float sink =
      dst[n / 2] + acc[n / 3] + residual[n / 4] +
      static_cast<float>(std::to_integer<int>(half[n]) + std::to_integer<int>(two[two.size() / 2]));
  (void)sink;
  std::fflush(stdout);
  return out;
}

}  // namespace kv_bench
