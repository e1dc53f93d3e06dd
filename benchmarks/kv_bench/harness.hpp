// What kv_bench's groups of cases share: the run's configuration, the samples a worker (client)
// process reports and their timing, and the per-setup table, figures and --json results.
// No kvstore worker or Asio here: every group file includes it.
#pragma once

#include "../bench_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace kv_bench {

using bench::clk;  // the clock and seconds every benchmark times with (bench_support.hpp)
using bench::secs;

// ---- configuration -----------------------------------------------------------------------

struct size_case {
  std::size_t bytes;
  int push_n, pull_n;  // ops per repetition
};

struct config {
  bool quick = false;
  int reps = 5;
  std::vector<size_case> sizes;
  std::vector<size_case> compressed_sizes;            // pushed and pulled in each encoding_case
  std::size_t convert_floats = std::size_t{4} << 20;  // the conversion loops' array (16 MiB)
  int latency_n = 3000;                               // push+wait 4 KiB per repetition
  int pingpong64_n = 5000;                            // 64-byte ping-pongs per repetition
  std::size_t many_keys = 1000;
  int many_rounds = 10;  // push-all-then-wait_all rounds per repetition
  // Growth: N single-float keys in one multi-key init, push and pull, for each N.
  std::vector<std::size_t> growth_keys = {1000, 10000, 100000, 1000000};
  // A backprop step: backprop_keys keys of mixed small sizes, each pushed by its own call (the
  // layers' gradients as they come), wait_all, then each pulled by its own call, wait_all.
  std::size_t backprop_keys = 200;
  int backprop_steps = 20;  // steps per repetition
  std::string only;         // --only: run only measurements whose name contains this
  // `only` is a comma-separated list of name parts.
  bool want(const std::string& name) const;
  // The op count of measurement `name`, 0 when filtered out.
  int n(const std::string& name, int count) const { return want(name) ? count : 0; }
};

config make_config(bool quick);

// dist_options::tcp_congestion for both sides (KVSTORE_TCP_CONGESTION; "auto" if unset): the
// baseline's sockets run the same congestion control as kvstore's, so neither gains from it.
std::string congestion_option();

// ---- samples -------------------------------------------------------------------------------

// One line a worker or client reports: measurement name, repetition, ops, payload bytes, seconds.
struct sample {
  std::string name;
  int rep;
  double ops, bytes, secs;
  double cpu = 0,
         csw = 0;   // the reporting process's CPU seconds (all threads) and context switches
  double wire = 0;  // bytes its TCP sockets sent and received (TCP_INFO)
  // The kvstore server processes' CPU seconds (all their threads) over the sample, as the
  // reporting worker read them (growth calls only: there the servers do most of the work).
  double server_cpu = 0;
};

// Starts a timed part: notes this process's CPU time, context switches and TCP bytes (all its
// threads), which the next report() subtracts.
clk::time_point mark();
// Writes s, with its usage since the last mark(), to the parent's pipe `out` (nothing for 0 ops).
void report(int out, const sample& s);
// "S name rep ops bytes secs cpu csw wire server_cpu": what report() writes, run_setup parses.
std::string fmt_sample(const sample& s);

void write_all(int fd, const std::string& s);

// Phase barrier through the parent: a process says R and waits for the parent's go byte. The
// parent releases the kvstore group and the baseline group in turn, phase by phase, so the two
// are measured interleaved (load from elsewhere hits both alike) and never at the same time.
struct pipe_barrier {
  int to_parent, from_parent;
  void wait();
};

// Worker w's value of key k: small integers, so sums over workers are exact in float.
inline float value_of(int w, std::size_t k, std::size_t i) {
  return static_cast<float>((i + k) % 7 + static_cast<std::size_t>(w) + 1);
}
inline float expected_sum(int workers, std::size_t k, std::size_t i) {
  float s = 0;
  for (int w = 0; w < workers; ++w) s += value_of(w, k, i);
  return s;
}

// Median seconds of `reps` runs of f.
template <class F>
double median_secs(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = clk::now();
    f();
    t.push_back(secs(a, clk::now()));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ---- figures and results -------------------------------------------------------------------

struct figure {
  double ops_s = 0, gb_s = 0, lo_ops = 0, hi_ops = 0;
  double cpu_us_op = 0, csw_op = 0;  // per op, summed over the worker (client) processes
  double wire_op = 0;  // TCP bytes sent and received per op by the worker (client) processes
  // The kvstore servers' CPU per op, all their threads (growth calls; each worker reads all the
  // servers over its call, so the largest reading counts, once).
  double server_cpu_us_op = 0;
  bool present = false;
};

// Per repetition: sum of ops and bytes over workers / the slowest worker's time; then the median.
figure aggregate(const std::vector<sample>& all, const std::string& name);

struct result {
  std::string name;
  double value;
  std::string unit;
  double baseline;
  double ratio;
  std::string table;  // the printed table it belongs to ("1x1", "1x1 growth", "conversion")
};

std::string human(std::size_t b);
// Bytes with two decimals in the largest unit that keeps them >= 1: "2.00 MiB", "80 B".
std::string human_bytes(double b);

// One setup's table ("1x1", "2x2c"): its samples, and where its rows' results and the figures
// the targets read go.
struct setup_table {
  std::string cl;  // the setup's name
  int W;
  const std::vector<sample>& kvs;
  const std::vector<sample>& base;
  std::vector<result>& results;
  std::map<std::string, figure>& figs;

  void header() const;
  // kvstore's measurement `name` next to the baseline's `base_name`; nothing when neither ran.
  void row(const std::string& name, const std::string& size, const std::string& pattern,
           const std::string& base_name);
};

// The --json file: one object per result; false when it cannot be written.
bool write_json(const std::string& path, const std::vector<result>& results);

}  // namespace kv_bench
