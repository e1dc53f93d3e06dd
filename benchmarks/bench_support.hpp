// What the benchmarks share: timing, the median [min, max] of repetitions, the results and their
// --json file, and the STREAM-style baseline loop (a k-way float sum split over threads) that
// local_bench and device_bench (OMP build) hold kvstore's sums against.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace bench {

using clk = std::chrono::steady_clock;

inline double secs(clk::time_point a, clk::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct stats {
  double med = 0, min = 0, max = 0;
};
/// The median, min and max of the repetitions' figures.
inline stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

/// One figure of a run, with the baseline it is compared to (< 0: none) and the ratio.
struct result {
  std::string name;
  double value;
  std::string unit;
  double baseline;
  double ratio;
};
inline std::vector<result> results;

/// The options every benchmark takes: --quick (tiny sizes, no targets judged) and --json FILE.
struct common_options {
  bool quick = false;
  std::string json;
  /// Takes argv[i] (and --json's file name, advancing i) if it is one of them; false for a
  /// benchmark's own options.
  bool take(int& i, int argc, char** argv) {
    const std::string a = argv[i];
    if (a == "--quick") return quick = true;
    if (a != "--json" || i + 1 >= argc) return false;
    json = argv[++i];
    return true;
  }
};

inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

/// Writes `results` as a JSON array of {name, value, unit, baseline, ratio}.
inline bool write_json(const std::string& path) {
  std::ofstream f(path);
  if (!f) return false;
  f << "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    char buf[512];
    std::snprintf(buf, sizeof buf, "  {\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", ",
                  json_escape(r.name).c_str(), r.value, json_escape(r.unit).c_str());
    f << buf;
    if (r.baseline >= 0)
      std::snprintf(buf, sizeof buf, "\"baseline\": %.6g, \"ratio\": %.4f}", r.baseline, r.ratio);
    else
      std::snprintf(buf, sizeof buf, "\"baseline\": null, \"ratio\": null}");
    f << buf << (i + 1 < results.size() ? ",\n" : "\n");
  }
  f << "]\n";
  return static_cast<bool>(f);
}

namespace detail {
// d[i] = s[0][i] + ... + s[K-1][i] over [lo, hi), left to right, as plain as the compiler gets
// it: a compile-time K and restrict pointers, so the loop vectorizes.
template <int K>
void sum_part(float* __restrict d, const float* const* s, std::size_t lo, std::size_t hi) {
  const float* __restrict p[K];
  for (int j = 0; j < K; ++j) p[j] = s[j];
#pragma GCC ivdep  // the output overlaps no input (GCC does not apply restrict to an array)
  for (std::size_t i = lo; i < hi; ++i) {
    float x = p[0][i];
    for (int j = 1; j < K; ++j) x += p[j][i];
    d[i] = x;
  }
}
inline void sum_part_any(float* d, std::span<const float* const> s, std::size_t lo,
                         std::size_t hi) {
  switch (s.size()) {
    case 2:
      return sum_part<2>(d, s.data(), lo, hi);
    case 4:
      return sum_part<4>(d, s.data(), lo, hi);
    case 8:
      return sum_part<8>(d, s.data(), lo, hi);
    default:
      for (std::size_t i = lo; i < hi; ++i) {
        float x = s[0][i];
        for (std::size_t j = 1; j < s.size(); ++j) x += s[j][i];
        d[i] = x;
      }
  }
}
}  // namespace detail

/// The STREAM-style baseline: d = srcs[0] + ... + srcs[k-1] (left to right), each of `threads`
/// threads a contiguous part; a part is at least 64 Ki elements, so small sums run on one thread
/// instead of paying for threads they cannot use. The threads are OpenMP's in a program built
/// with it (device_bench's OMP build, whose store runs OpenMP loops too), else std::threads.
inline void stream_sum(float* d, std::span<const float* const> srcs, std::size_t n,
                       unsigned threads) {
  const std::size_t parts =
      std::max<std::size_t>(1, std::min<std::size_t>(threads, n / (std::size_t{1} << 16)));
  auto part = [&](std::size_t t) {
    detail::sum_part_any(d, srcs, n * t / parts, n * (t + 1) / parts);
  };
#ifdef _OPENMP
  const int nt = static_cast<int>(parts);
#pragma omp parallel for num_threads(nt) schedule(static, 1)
  for (std::size_t t = 0; t < parts; ++t) part(t);
#else
  std::vector<std::thread> ts;
  for (std::size_t t = 1; t < parts; ++t) ts.emplace_back(part, t);
  part(0);
  for (auto& t : ts) t.join();
#endif
}

}  // namespace bench
