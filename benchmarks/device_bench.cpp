// device_bench: KVStore<device> against plain device work on the same bytes, in the same run.
//
//  (a) k-way sum: k = 2, 4, 8 values of 4 KiB .. 256 MiB (float) pushed to one key, summed into
//      its value on the owner device by one fused kernel. Baseline: a device-to-device copy of the
//      same bytes (cudaMemcpyAsync; memcpy on the OMP build) and, on the OMP build, the
//      STREAM-style loop local_bench uses (bench_support.hpp) doing the same sum. GB/s counts every
//      byte read and written: (k + 1) x size for the sum, 2 x size for the copy, in 1e9 B/s. Also
//      the fused kernel alone (no store), to tell the kernel's efficiency from the store's per-op
//      cost. Ops are issued in batches, then waited for.
//  (b) fused update: 4 values summed and applied by SGD in one pass (the store's push), against
//      the sum into a scratch buffer and then an SGD pass (what KVStore<local> does). Plain SGD
//      and SGD with momentum; 256 MiB values on CUDA, 64 MiB on the OMP build. Ratio = unfused
//      time / fused time. By bytes moved the most it can be is 8/6 = 1.33 (plain) and 10/8 =
//      1.25 (momentum).
//  (c) small ops: push+pull of 4 KiB values over 1,000 keys (all issued, then wait_all), ops/s
//      counting a push and a pull as one op each. Baseline: two raw 4 KiB device copies per key
//      and round on one stream.
//  (d) staging for dist: 64 MiB device -> host into pinned memory (device_staging::gather) vs
//      into pageable memory (a plain copy into a std::vector).
//
// Every figure is the median of several repetitions (min and max shown).
// usage: device_bench [--quick] [--json FILE] [--max-mib N]
// Exit status: 0 when every checked result was right, 1 on a wrong value, 2 on a usage error.
// A CUDA build with no GPU visible prints so and exits 77.
#include <kvstore/device.hpp>

#include "bench_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace rt = kvstore::detail::rt;
using bench::clk;
using bench::results;
using bench::secs;
using bench::summarize;
using store = kvstore::KVStore<kvstore::device, float>;

std::string size_name(std::size_t bytes) {
  return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "MiB"
                             : std::to_string(bytes >> 10) + "KiB";
}

// Repetitions per size: enough bytes per measurement that launch latency does not dominate.
int reps_for(std::size_t bytes, bool quick) {
  if (quick) return 3;
  if (bytes <= (64u << 10)) return 200;
  if (bytes <= (16u << 20)) return 20;
  return 7;
}
// Ops issued back to back per timed repetition, then waited for (as a training step issues its
// pushes): launch latency is amortized the same way for the store, the kernel and the copy.
int batch_for(std::size_t bytes) { return bytes <= (1u << 20) ? 20 : bytes <= (16u << 20) ? 8 : 4; }

bool bench_sum(bool quick, std::size_t max_bytes, const std::vector<int>& devs) {
  // The baseline's threads: as many as the OpenMP loops of the store's kernels use.
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::size_t> sizes;
  for (std::size_t b = 4u << 10; b <= max_bytes; b *= 4) sizes.push_back(b);
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);
  bool ok = true;
  std::printf(
      "(a) k-way sum into the owner vs a device-to-device copy of the same bytes%s;\n"
      "    GB/s = bytes read + written per second (1e9); median of reps [min, max]\n",
      rt::is_cuda ? "" : " and local_bench's STREAM-style loop (bench_support.hpp)");
  for (int k : {2, 4, 8}) {
    for (std::size_t bytes : sizes) {
      const std::size_t n = bytes / sizeof(float);
      store kv(kvstore::device_options{.devices = devs, .placement = kvstore::placement::first});
      const int owner = devs[0];
      std::vector<kvstore::device_buffer<float>> src;
      std::vector<kvstore::device_span<const float>> spans;
      for (int j = 0; j < k; ++j) {
        std::vector<float> h(n);
        for (std::size_t i = 0; i < n; ++i)
          h[i] = static_cast<float>((i + static_cast<std::size_t>(j)) % 64);
        src.emplace_back(std::span<const float>(h),
                         devs[static_cast<std::size_t>(j) % devs.size()]);
        spans.push_back(src.back().cspan());
      }
      kvstore::device_buffer<float> copy_dst(n, owner), kernel_dst(n, owner);
      std::vector<float> zero(n, 0.f);
      kv.init(0, std::span<const float>(zero));
      std::vector<const float*> raw;
      for (auto& s : src) raw.push_back(s.data());
      rt::stream_t cs = rt::stream_create(owner, 0);
      const int reps = reps_for(bytes, quick), batch = batch_for(bytes);
      std::vector<double> t_sum, t_copy, t_stream, t_kernel;
      for (int r = 0; r < reps + 1; ++r) {
        auto a = clk::now();
        for (int i = 0; i < batch; ++i)
          kv.push(0, std::span<const kvstore::device_span<const float>>(spans));
        kv.wait_all();
        auto b = clk::now();
        for (int i = 0; i < batch; ++i) rt::copy_async(copy_dst.data(), src[0].data(), bytes, cs);
        rt::stream_sync(cs);
        auto c = clk::now();
        if (!rt::is_cuda)
          for (int i = 0; i < batch; ++i) bench::stream_sum(copy_dst.data(), raw, n, threads);
        auto d = clk::now();
        {  // the fused kernel alone, no store around it
          rt::device_guard g(owner);
          for (int i = 0; i < batch; ++i)
            kvstore::reduce::fused_sum_update<float>(cs, raw.data(), k, kernel_dst.data(), nullptr,
                                                     nullptr, kernel_dst.data(), n,
                                                     kvstore::reduce::device_update<float>{});
          rt::stream_sync(cs);
        }
        auto e = clk::now();
        if (r == 0) continue;
        t_kernel.push_back(double(k + 1) * double(bytes) * batch / secs(d, e) / 1e9);
        t_sum.push_back(double(k + 1) * double(bytes) * batch / secs(a, b) / 1e9);
        t_copy.push_back(2.0 * double(bytes) * batch / secs(b, c) / 1e9);
        if (!rt::is_cuda)
          t_stream.push_back(double(k + 1) * double(bytes) * batch / secs(c, d) / 1e9);
      }
      rt::stream_destroy(owner, cs);
      std::vector<float> got(n);
      kv.pull(0, std::span<float>(got)).wait();
      for (std::size_t i = 0; i < n && ok; i += 997) {
        float want = 0;
        for (int j = 0; j < k; ++j)
          want += static_cast<float>((i + static_cast<std::size_t>(j)) % 64);
        if (got[i] != want) {
          std::fprintf(stderr, "device_bench: sum k=%d: element %zu is %g, expected %g\n", k, i,
                       got[i], want);
          ok = false;
        }
      }
      const auto s = summarize(t_sum), c = summarize(t_copy), kn = summarize(t_kernel);
      const std::string nm = "sum_k" + std::to_string(k) + "_" + size_name(bytes);
      std::printf(
          "    k=%d %8s  store push %7.1f GB/s [%.1f, %.1f]  kernel %7.1f  copy %7.1f GB/s  ratio "
          "store/copy %.3f"
          " kernel/copy %.3f",
          k, size_name(bytes).c_str(), s.med, s.min, s.max, kn.med, c.med, s.med / c.med,
          kn.med / c.med);
      results.push_back({nm + "_vs_copy", s.med, "GB/s", c.med, s.med / c.med});
      results.push_back({nm + "_kernel_vs_copy", kn.med, "GB/s", c.med, kn.med / c.med});
      if (!rt::is_cuda) {
        const auto st = summarize(t_stream);
        std::printf("  STREAM loop %7.1f GB/s  ratio %.3f", st.med, s.med / st.med);
        results.push_back({nm + "_vs_stream_loop", s.med, "GB/s", st.med, s.med / st.med});
      }
      if (!quick && bytes >= (64u << 20) && rt::is_cuda)
        std::printf("  (target >= 0.9 x copy: %s)", s.med / c.med >= 0.9 ? "met" : "NOT met");
      std::printf("\n");
    }
  }
  return ok;
}

bool bench_fused(bool quick, std::size_t max_bytes, const std::vector<int>& devs) {
  const std::size_t bytes =
      std::min<std::size_t>(max_bytes, quick ? (1u << 20) : (rt::is_cuda ? 256u : 64u) << 20);
  const std::size_t n = bytes / sizeof(float);
  const int owner = devs[0];
  const int k = 4, reps = quick ? 3 : 11, batch = 4;
  std::vector<kvstore::device_buffer<float>> src;
  std::vector<const float*> p;
  for (int j = 0; j < k; ++j) {
    std::vector<float> h(n, 0.001f * static_cast<float>(j + 1));
    src.emplace_back(std::span<const float>(h), owner);
    p.push_back(src.back().data());
  }
  kvstore::device_buffer<float> w(std::span<const float>(std::vector<float>(n, 1.f)), owner);
  kvstore::device_buffer<float> mom(std::span<const float>(std::vector<float>(n, 0.f)), owner);
  kvstore::device_buffer<float> scratch(n, owner);
  rt::stream_t s = rt::stream_create(owner, 0);
  rt::device_guard g(owner);
  std::printf(
      "(b) fused sum + SGD vs sum then SGD, %d values of %s on the owner; time per update\n", k,
      size_name(bytes).c_str());
  for (double momentum : {0.0, 0.9}) {
    kvstore::reduce::device_update<float> u;
    u.kind = kvstore::reduce::device_update<float>::sgd;
    u.sgd_st = kvstore::optim::sgd{.learning_rate = 0.01, .momentum = momentum}.step<float>();
    float* s0 = momentum > 0 ? mom.data() : nullptr;
    std::vector<double> t_f, t_u;
    for (int r = 0; r < reps + 1; ++r) {
      auto a = clk::now();
      for (int i = 0; i < batch; ++i)
        kvstore::reduce::fused_sum_update<float>(s, p.data(), k, w.data(), s0, nullptr,
                                                 scratch.data(), n, u);
      rt::stream_sync(s);
      auto b = clk::now();
      for (int i = 0; i < batch; ++i) {
        kvstore::reduce::fused_sum_update<float>(s, p.data(), k, scratch.data(), nullptr, nullptr,
                                                 scratch.data(), n,
                                                 kvstore::reduce::device_update<float>{});
        const float* gp = scratch.data();
        kvstore::reduce::fused_sum_update<float>(s, &gp, 1, w.data(), s0, nullptr, scratch.data(),
                                                 n, u);
      }
      rt::stream_sync(s);
      auto c = clk::now();
      if (r == 0) continue;
      t_f.push_back(secs(a, b) / batch);
      t_u.push_back(secs(b, c) / batch);
    }
    const auto f = summarize(t_f), uu = summarize(t_u);
    const std::string nm = momentum > 0 ? "fused_sum_sgd_momentum_" : "fused_sum_sgd_";
    std::printf(
        "    %-14s fused %8.3f ms [%.3f, %.3f]  unfused %8.3f ms  speedup %.3f%s\n",
        momentum > 0 ? "SGD momentum" : "plain SGD", f.med * 1e3, f.min * 1e3, f.max * 1e3,
        uu.med * 1e3, uu.med / f.med,
        quick ? ""
              : (uu.med / f.med >= 1.3 ? "  (target >= 1.3: met)" : "  (target >= 1.3: NOT met)"));
    results.push_back({nm + size_name(bytes), f.med * 1e3, "ms", uu.med * 1e3, uu.med / f.med});
  }
  rt::stream_destroy(owner, s);
  return true;
}

bool bench_small(bool quick, const std::vector<int>& devs) {
  const std::size_t keys = 1000, elems = 1024;  // 4 KiB of float
  const int rounds = quick ? 2 : 20, reps = quick ? 3 : 7;
  const double ops = 2.0 * static_cast<double>(keys) * rounds;
  store kv(kvstore::device_options{.devices = devs});
  std::vector<kvstore::device_buffer<float>> in, out;
  for (std::size_t k = 0; k < keys; ++k) {
    std::vector<float> h(elems, static_cast<float>(k));
    in.emplace_back(std::span<const float>(h), devs[k % devs.size()]);
    out.emplace_back(elems, devs[(k + 1) % devs.size()]);
    kv.init(static_cast<int>(k), in.back().cspan());
  }
  rt::stream_t s = rt::stream_create(devs[0], 0);
  std::vector<double> t_kv, t_raw;
  for (int r = 0; r < reps + 1; ++r) {
    auto a = clk::now();
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t k = 0; k < keys; ++k) {
        kv.push(static_cast<int>(k), in[k].cspan());
        kv.pull(static_cast<int>(k), out[k].span());
      }
      kv.wait_all();
    }
    auto b = clk::now();
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t k = 0; k < keys; ++k) {
        rt::copy_async(out[k].data(), in[k].data(), elems * sizeof(float), s);
        rt::copy_async(out[k].data(), in[k].data(), elems * sizeof(float), s);
      }
      rt::stream_sync(s);
    }
    auto c = clk::now();
    if (r == 0) continue;
    t_kv.push_back(ops / secs(a, b));
    t_raw.push_back(ops / secs(b, c));
  }
  rt::stream_destroy(devs[0], s);
  bool ok = true;
  for (std::size_t k = 0; k < keys && ok; k += 97) {
    auto h = out[k].to_host();
    ok = h[0] == static_cast<float>(k) && h[elems - 1] == static_cast<float>(k);
    if (!ok) std::fprintf(stderr, "device_bench: small ops: key %zu pulled a wrong value\n", k);
  }
  const auto s1 = summarize(t_kv), s2 = summarize(t_raw);
  std::printf(
      "(c) push+pull of 4 KiB over %zu keys, %d rounds: store %10.0f ops/s [%.0f, %.0f]; raw "
      "copies %10.0f "
      "ops/s; ratio %.3f\n",
      keys, rounds, s1.med, s1.min, s1.max, s2.med, s1.med / s2.med);
  results.push_back({"small_4KiB_push_pull_1000keys", s1.med, "ops/s", s2.med, s1.med / s2.med});
  return ok;
}

bool bench_staging(bool quick, std::size_t max_bytes, const std::vector<int>& devs) {
  const std::size_t bytes = std::min<std::size_t>(max_bytes, quick ? (1u << 20) : (64u << 20));
  const std::size_t n = bytes / sizeof(float);
  kvstore::device_buffer<float> d(std::span<const float>(std::vector<float>(n, 2.f)), devs[0]);
  kvstore::device_staging<float> st;
  std::vector<float> pageable(n);
  const std::vector<kvstore::device_span<const float>> one{d.cspan()};
  const int reps = quick ? 3 : 11;
  std::vector<double> t_pin, t_page;
  for (int r = 0; r < reps + 1; ++r) {
    auto a = clk::now();
    auto h = st.gather(one);
    auto b = clk::now();
    {
      rt::device_guard g(devs[0]);
      rt::copy_async(pageable.data(), d.data(), bytes, nullptr);
      rt::stream_sync(nullptr);
    }
    auto c = clk::now();
    if (r == 0) {
      if (h[n - 1] != 2.f || pageable[n - 1] != 2.f) {
        std::fprintf(stderr, "device_bench: staging: wrong value\n");
        return false;
      }
      continue;
    }
    t_pin.push_back(double(bytes) / secs(a, b) / 1e9);
    t_page.push_back(double(bytes) / secs(b, c) / 1e9);
  }
  const auto p = summarize(t_pin), q = summarize(t_page);
  std::printf(
      "(d) device -> host staging of %s: pinned %.2f GB/s [%.2f, %.2f], pageable %.2f GB/s, ratio "
      "%.3f\n",
      size_name(bytes).c_str(), p.med, p.min, p.max, q.med, p.med / q.med);
  results.push_back(
      {"staging_d2h_pinned_" + size_name(bytes), p.med, "GB/s", q.med, p.med / q.med});
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  bench::common_options opts;
  std::size_t max_mib = rt::is_cuda ? 256 : 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (opts.take(i, argc, argv)) {
      continue;
    } else if (a == "--max-mib" && i + 1 < argc) {
      max_mib = static_cast<std::size_t>(std::max(1, std::atoi(argv[++i])));
    } else {
      std::fprintf(stderr, "usage: device_bench [--quick] [--json FILE] [--max-mib N]\n");
      return 2;
    }
  }
  const bool quick = opts.quick;
  const std::string& json = opts.json;
  if (rt::is_cuda && rt::device_count() == 0) {
    std::printf("device_bench: no CUDA device visible: skipped\n");
    return 77;
  }
  std::vector<int> devs;
  if (rt::is_cuda) {
    for (int d = 0; d < rt::device_count() && d < 8; ++d) devs.push_back(d);
  } else {
    devs = {0, 1};
  }
  if (quick) max_mib = 1;
  const std::size_t max_bytes = max_mib << 20;
  std::printf("device_bench%s: KVStore<device> (%s, %zu device%s) vs plain device work, same run\n",
              quick ? " --quick (tiny sizes, no targets judged)" : "",
              rt::is_cuda ? "CUDA" : "Thrust OMP backend", devs.size(),
              devs.size() == 1 ? "" : "s");
  bool ok = true;
  try {
    ok = bench_sum(quick, max_bytes, devs) && ok;
    ok = bench_fused(quick, max_bytes, devs) && ok;
    ok = bench_small(quick, devs) && ok;
    ok = bench_staging(quick, max_bytes, devs) && ok;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_bench: %s\n", e.what());
    return 1;
  }
  if (!json.empty() && !bench::write_json(json)) {
    std::fprintf(stderr, "device_bench: cannot write %s\n", json.c_str());
    return 1;
  }
  return ok ? 0 : 1;
}
