// local_bench: KVStore<local> against plain loops doing the same work, in the same run.
//
//  (a) reduction: 4 device values of 64 MiB (float) pushed to one key, so the store sums them
//      into its value on the engine's pool (reduce::sum_into over engine::parallel_for); also
//      reduce::sum_into on a bare engine. Baseline: a STREAM-style loop d[i] = a[i]+b[i]+c[i]+e[i]
//      split over the same number of threads (std::thread), same buffers. Convention: GB/s counts
//      every byte read and written, 5 x 64 MiB per reduction (4 inputs read, 1 output written),
//      in 1e9 bytes per second.
//  (b) small ops: push+pull pairs of 1 KiB values (256 floats) over 1,000 keys (issue every
//      push and pull, then wait_all), ops/s counting a push and a pull as one op each. Baseline:
//      the same arithmetic inline on the calling thread (copy the value into the key's storage,
//      copy it out again), no engine. Engine overhead per op = (t_store - t_inline) / ops.
//
// Every figure is the median of several repetitions (min and max shown), interleaved with its
// baseline so that load from other processes hits both alike.
//
// usage: local_bench [--quick] [--json FILE] [--threads N]
// Exit status: 0 when every result was right (targets met or not), 1 on a wrong value, 2 on
// a usage error.
#include <kvstore/local.hpp>

#include "bench_support.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using bench::clk;
using bench::results;
using bench::secs;
using bench::summarize;

// CPU seconds (all threads) and context switches of this process so far.
struct usage {
  double cpu = 0, csw = 0;
};
usage usage_now() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return {tv(ru.ru_utime) + tv(ru.ru_stime), double(ru.ru_nvcsw + ru.ru_nivcsw)};
}

// Keeps the optimizer from dropping a result.
volatile float sink;

// ---- (a) reduction -------------------------------------------------------------------------

bool check_sum(const std::vector<float>& got, const std::vector<std::vector<float>>& in,
               const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float want = in[0][i] + in[1][i] + in[2][i] + in[3][i];
    if (got[i] != want) {
      std::fprintf(stderr, "local_bench: %s: element %zu is %g, expected %g\n", what, i, got[i],
                   want);
      return false;
    }
  }
  return true;
}

bool bench_reduce(bool quick, unsigned threads) {
  const std::size_t bytes = quick ? (std::size_t{4} << 20) : (std::size_t{64} << 20);
  const std::size_t n = bytes / sizeof(float);
  const int reps = quick ? 3 : 11;
  const double moved = 5.0 * static_cast<double>(bytes);  // 4 reads + 1 write per element

  std::vector<std::vector<float>> in(4, std::vector<float>(n));
  for (int k = 0; k < 4; ++k)
    for (std::size_t i = 0; i < n; ++i)
      in[k][i] = static_cast<float>((i + static_cast<std::size_t>(k)) % 64);
  std::vector<float> base_out(n, 0.f), out(n, 0.f);

  kvstore::local_options o;
  o.threads = threads;
  kvstore::KVStore<kvstore::local, float> kv(o);
  kv.init(0, std::span<const float>(out));
  // The engine the store would use, bare: reduce::sum_into over its pool from the caller.
  kvstore::detail::engine eng(threads);
  std::vector<std::span<const float>> srcs(in.begin(), in.end());

  std::vector<double> t_store, t_sum, t_base;
  for (int r = 0; r < reps + 1; ++r) {  // rep 0 warms up and is dropped
    auto a = clk::now();
    kv.push(0, {std::span<const float>(in[0]), std::span<const float>(in[1]),
                std::span<const float>(in[2]), std::span<const float>(in[3])})
        .wait();
    auto b = clk::now();
    kvstore::reduce::sum_into<float>(eng, std::span<float>(out),
                                     std::span<const std::span<const float>>(srcs));
    auto c = clk::now();
    const float* srcs4[] = {in[0].data(), in[1].data(), in[2].data(), in[3].data()};
    bench::stream_sum(base_out.data(), srcs4, n, threads);
    auto d = clk::now();
    if (r == 0) continue;
    t_store.push_back(moved / secs(a, b) / 1e9);
    t_sum.push_back(moved / secs(b, c) / 1e9);
    t_base.push_back(moved / secs(c, d) / 1e9);
  }
  bool ok = check_sum(base_out, in, "STREAM loop") && check_sum(out, in, "reduce::sum_into");
  std::vector<float> pulled(n, -1.f);
  kv.pull(0, std::span<float>(pulled)).wait();
  ok = check_sum(pulled, in, "KVStore push of 4 values") && ok;

  auto s = summarize(t_store), u = summarize(t_sum), b = summarize(t_base);
  std::printf(
      "(a) reduction of 4 x %zu MiB float into the store, %u threads, %d reps; GB/s = (4 inputs "
      "read +\n"
      "    1 output written) / time, 1e9 B/s; median [min, max]\n",
      bytes >> 20, threads, reps);
  std::printf("    %-36s %7.2f GB/s  [%.2f, %.2f]\n", "KVStore<local> push of 4 values", s.med,
              s.min, s.max);
  std::printf("    %-36s %7.2f GB/s  [%.2f, %.2f]\n", "reduce::sum_into over the engine", u.med,
              u.min, u.max);
  std::printf("    %-36s %7.2f GB/s  [%.2f, %.2f]\n", "STREAM-style loop (baseline)", b.med, b.min,
              b.max);
  const double ratio = s.med / b.med, ratio2 = u.med / b.med;
  std::printf("    ratio store / loop: %.3f (target >= 0.9: %s); sum_into / loop: %.3f\n", ratio,
              quick          ? "not judged in --quick"
              : ratio >= 0.9 ? "met"
                             : "NOT met",
              ratio2);
  const std::string sz = std::to_string(bytes >> 20) + "MiB";
  results.push_back({"reduce_4x" + sz + "_store_push", s.med, "GB/s", b.med, ratio});
  results.push_back({"reduce_4x" + sz + "_sum_into_engine", u.med, "GB/s", b.med, ratio2});
  results.push_back({"reduce_4x" + sz + "_stream_loop", b.med, "GB/s", -1, -1});
  return ok;
}

// ---- (b) small ops -------------------------------------------------------------------------

bool bench_small(bool quick, unsigned threads) {
  const std::size_t keys = 1000, elems = 256;  // 1 KiB of float per value
  const int rounds = quick ? 5 : 200;          // rounds per repetition
  const int reps = quick ? 3 : 9;
  const double ops =
      2.0 * static_cast<double>(keys) * rounds;  // a push and a pull per key and round

  std::vector<std::vector<float>> vals(keys, std::vector<float>(elems)),
      outs(keys, std::vector<float>(elems));
  for (std::size_t k = 0; k < keys; ++k)
    for (std::size_t i = 0; i < elems; ++i) vals[k][i] = static_cast<float>(k * 3 + i);

  kvstore::local_options o;
  o.threads = threads;
  kvstore::KVStore<kvstore::local, float> kv(o);
  std::vector<float> zero(elems, 0.f);
  for (std::size_t k = 0; k < keys; ++k) kv.init(static_cast<int>(k), std::span<const float>(zero));
  // The inline baseline's storage, one value per key as in the store.
  std::vector<std::vector<float>> store(keys, std::vector<float>(elems, 0.f));

  std::vector<double> t_kv, t_inline, cpu_kv, csw_kv;
  bool ok = true;
  for (int r = 0; r < reps + 1; ++r) {
    const usage ua = usage_now();
    auto a = clk::now();
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t k = 0; k < keys; ++k) {
        kv.push(static_cast<int>(k), std::span<const float>(vals[k]));
        kv.pull(static_cast<int>(k), std::span<float>(outs[k]));
      }
      kv.wait_all();
    }
    auto b = clk::now();
    const usage ub = usage_now();
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t k = 0; k < keys; ++k) {
        // What the store's push and pull tasks do: sum of one input (a copy) in, a copy out.
        std::memcpy(store[k].data(), vals[k].data(), elems * sizeof(float));
        std::memcpy(outs[k].data(), store[k].data(), elems * sizeof(float));
      }
      sink = outs[static_cast<std::size_t>(round) % keys][0];
    }
    auto c = clk::now();
    if (r == 0) {
      for (std::size_t k = 0; k < keys && ok; ++k)
        if (outs[k] != vals[k]) {
          std::fprintf(stderr, "local_bench: small ops: key %zu pulled a wrong value\n", k);
          ok = false;
        }
      continue;
    }
    t_kv.push_back(secs(a, b));
    t_inline.push_back(secs(b, c));
    cpu_kv.push_back((ub.cpu - ua.cpu) / ops * 1e6);
    csw_kv.push_back((ub.csw - ua.csw) / ops);
  }
  auto s = summarize(t_kv), i = summarize(t_inline);
  auto rate = [&](double t) { return ops / t; };
  const double over_us = (s.med - i.med) / ops * 1e6;
  std::printf(
      "(b) push+pull pairs of 1 KiB over %zu keys (all issued, then wait_all), %d rounds x %d "
      "reps,\n"
      "    %u engine threads; ops/s counts a push and a pull as one op each; median [min, max]\n",
      keys, rounds, reps, threads);
  std::printf("    %-36s %10.0f ops/s  [%.0f, %.0f]\n", "KVStore<local> push + pull", rate(s.med),
              rate(s.max), rate(s.min));
  std::printf("    %-36s %10.0f ops/s  [%.0f, %.0f]\n", "inline copies, no engine (baseline)",
              rate(i.med), rate(i.max), rate(i.min));
  std::printf(
      "    engine overhead: %.3f us/op (min %.3f, max %.3f); ratio store / inline: %.4f; "
      "target < 2 us/op: %s\n",
      over_us, (s.min - i.med) / ops * 1e6, (s.max - i.med) / ops * 1e6, i.med / s.med,
      quick           ? "not judged in --quick"
      : over_us < 2.0 ? "met"
                      : "NOT met");
  auto cu = summarize(cpu_kv), cs = summarize(csw_kv);
  std::printf(
      "    store: %.2f us of CPU per op (all threads; inline: %.3f us), %.2f context switches per "
      "op\n",
      cu.med, i.med / ops * 1e6, cs.med);
  results.push_back({"small_1KiB_store_cpu", cu.med, "us/op", i.med / ops * 1e6,
                     cu.med > 0 ? i.med / ops * 1e6 / cu.med : -1});
  results.push_back(
      {"small_1KiB_push_pull_1000keys", rate(s.med), "ops/s", rate(i.med), i.med / s.med});
  results.push_back({"small_1KiB_engine_overhead", over_us, "us/op", -1, -1});
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bench::common_options opts;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (opts.take(i, argc, argv)) {
      continue;
    } else if (a == "--threads" && i + 1 < argc) {
      threads = static_cast<unsigned>(std::max(1, std::atoi(argv[++i])));
    } else {
      std::fprintf(stderr, "usage: local_bench [--quick] [--json FILE] [--threads N]\n");
      return 2;
    }
  }
  const bool quick = opts.quick;
  const std::string& json = opts.json;
  std::printf("local_bench%s: KVStore<local> vs plain loops, same run\n",
              quick ? " --quick (no targets judged)" : "");
  bool ok = true;
  try {
    ok = bench_reduce(quick, threads) && ok;
    ok = bench_small(quick, threads) && ok;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "local_bench: %s\n", e.what());
    return 1;
  }
  if (quick) std::printf("(--quick: tiny sizes, figures not meaningful, targets not judged)\n");
  if (!json.empty() && !bench::write_json(json)) {
    std::fprintf(stderr, "local_bench: cannot write %s\n", json.c_str());
    return 1;
  }
  return ok ? 0 : 1;
}
