// A setup's processes: the kvstore cluster (scheduler, servers, workers) and the baseline's
// (servers, clients), forked from this process, released phase by phase, their samples collected.
#pragma once

#include "harness.hpp"

#include <kvstore/options.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kv_bench {

// A kvstore worker process's and a baseline client process's work: the cases in order, each
// phase after bar.wait(), samples written to `out`. The exit status: 0, or 3 on wrong values.
using kv_worker_fn = int(int out, const config& cfg, kvstore::dist_options o, int rank,
                         pipe_barrier bar);
using raw_worker_fn = int(int out, const config& cfg, const std::vector<std::uint16_t>& ports,
                          int S, pipe_barrier bar);

struct setup_plan {
  int W, S;
  bool colocated;  // the kvstore servers run inside the W workers (S == W), no server process
  bool with_kv, with_raw;
  std::size_t raw_bytes;  // each baseline server's store
  kv_worker_fn* kv_worker;
  raw_worker_fn* raw_worker;
};

// Starts both clusters, runs their phases in turn and collects the samples. Every child is
// reaped (or killed) before this returns; false when one failed or hung.
bool run_setup(const config& cfg, const setup_plan& p, std::vector<sample>& kv_out,
               std::vector<sample>& base_out);

// Kills and reaps every child still running.
void kill_children();

// CPU seconds of the running setup's kvstore server processes so far, all their threads (0
// when colocated). For the workers, forked after the servers.
double servers_cpu();

}  // namespace kv_bench
