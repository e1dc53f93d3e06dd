// kv_bench's entry: the flags, the cases in the order a worker (client) process runs them and a
// setup's table prints them, the setups, the targets. KVStore<dist> push and pull over loopback
// TCP against a raw Asio TCP baseline moving the same bytes in the same pattern, in the same run.

// Processes (all forked from this one before it starts any thread; every child is killed and
// reaped on the way out, and dies with this process through PR_SET_PDEATHSIG):
//   kvstore:  a scheduler, S servers (kvstore::node_loop), W worker processes
//             (KVStore<dist, float>, dist_sync, no optimizer); 1x1 and 2x2, and 2x2c: 2 colocated
//             workers, each serving one shard itself (dist_options::colocated, no server
//             processes; the baseline is 2x2's).
//   baseline: S server processes and W client processes speaking a minimal framed protocol with
//             Boost.Asio (24-byte header + raw payload; TCP_NODELAY; the server reads payloads
//             into a preallocated store, as a transport must at least do). Each key's bytes come
//             from and go to a place of their own on both sides (the header's offset), as each
//             kvstore key has its own memory: 1,000 keys of 4 KiB are 4 MB on each side, not one
//             4 KiB buffer that stays in the cache.
//
// Patterns, per worker (W workers run them at the same time; aggregates = sum over workers of
// ops and bytes / the slowest worker's time):
//   push S     one key of S bytes pushed N times back to back (ops on one key run one after the
//              other: each push is sent, then acknowledged). Baseline: send S bytes (split over
//              servers exactly as kvstore slices the key), wait for each server's 24-byte ack.
//   pull S     the same with pulls: baseline sends a 24-byte request, reads S bytes back.
//   push+wait  4 KiB push, op.wait() each: latency-bound; baseline as push 4 KiB. Also a plain
//              64-byte ping-pong for reference (the "raw ping-pong rate").
//   many keys  1,000 keys of 4 KiB: push all, then wait_all, repeated. Baseline: 1,000 framed
//              4 KiB messages, each from and to its key's own place, written back to back (to
//              each key's server), 1,000 acks read.
//   compressed push and pull of 4 MiB and 64 MiB keys in fp16 and bf16, and push in 2 bits
//              (init_options::compression; 2-bit pulls travel plain), next to the raw baseline's
//              plain push and pull of the same values: GB/s counts the float payload, "B/op" the
//              bytes the kernel saw the worker (client) send and receive per op (TCP_INFO).
//   adam       the largest key pushed back to back while the servers apply Adam (set last:
//              it changes every later push), next to the raw push of the same bytes; and one
//              thread's Adam loop over the same floats (what a server's update costs per round
//              without its pool, dist_options::server_threads).
//   conversion one thread, no network: each encode and decode loop of wire/encoding.hpp over
//              16 MiB of float, next to memcpy of the same 16 MiB (the cost per byte sent).
// GB/s counts payload bytes only, 1e9 B/s. Both clusters run at once but take turns, phase by
// phase (kvstore, then the baseline, then the next phase), so load from other processes hits both
// alike; each figure is the median of several repetitions.
//
// usage: kv_bench [--quick] [--json FILE]   (--setup 1x1,2x2,2x2c picks the setups)
// Exit status: 0 when every run completed with right values (targets met or not), 1 on an error
// (a wrong value, a child that failed or hung), 2 on a usage error.
#include "cases.hpp"
#include "cluster.hpp"

#include <signal.h>

#include <cstdlib>
#include <fstream>

namespace kv_bench {
namespace {

// A kvstore worker: each group inits its keys (in this order: the ids and the servers' state
// stay as they were), then every repetition runs their phases in the order the baseline's
// client runs its own (a phase of each side in turn).
int kv_worker(int out, const config& cfg, kvstore::dist_options o, int rank, pipe_barrier bar) {
  o.role = kvstore::role::worker;
  o.rank_hint = rank;
  store kv(o);
  const int W = kv.num_workers();
  const int me = kv.rank();
  kv_ctx c{kv, cfg, out, bar, W, me};
  dense_kv dense(c);
  many_kv many(c);
  compressed_kv compressed(c);
  growth_kv growth(c);
  backprop_kv backprop(c);
  for (int rep = 0; rep < cfg.reps; ++rep) {
    dense.sizes(rep);
    compressed.rep(rep);
    dense.pushwait(rep);
    many.rep(rep);
    growth.rep(rep);
    backprop.rep(rep);
  }
  many.check_values();
  adam_push(c, dense);
  if (c.errors) write_all(out, "E wrong values\n");
  return c.errors ? 3 : 0;
}

// The bytes the baseline's buffers hold: the biggest size, a growth case's keys and values (12
// bytes a key), or every key of the many-keys and backprop cases side by side.
std::size_t baseline_bytes(const config& cfg) {
  std::size_t max_bytes = std::max(cfg.many_keys * 4096, backprop_bytes(cfg.backprop_keys));
  for (auto& sc : cfg.sizes) max_bytes = std::max(max_bytes, sc.bytes);
  for (auto n : cfg.growth_keys) max_bytes = std::max(max_bytes, 12 * n);
  return max_bytes;
}

int raw_worker(int out, const config& cfg, const std::vector<std::uint16_t>& ports, int S,
               pipe_barrier bar) {
  raw_client cl(ports, baseline_bytes(cfg));
  raw_ctx c{cl, cfg, out, bar, S};
  for (int rep = 0; rep < cfg.reps; ++rep) {
    dense_raw_sizes(c, rep);
    dense_raw_latency(c, rep);
    many_raw(c, rep);
    growth_raw(c, rep);
    backprop_raw(c, rep);
  }
  return 0;
}

// A setup's table: each case's row next to its baseline, then the growth tables.
void print_rows(const config& cfg, setup_table& t) {
  t.header();
  for (auto& sc : cfg.sizes) {
    const std::string tag = std::to_string(sc.bytes);
    t.row("push_" + tag, human(sc.bytes), "push (1 key, back to back)", "push_" + tag);
    t.row("pull_" + tag, human(sc.bytes), "pull (1 key, back to back)", "pull_" + tag);
  }
  // Compressed, next to the raw baseline's plain push and pull of the same floats.
  for (auto& sc : cfg.compressed_sizes)
    for (auto& ec : encoding_cases) {
      const std::string tag = std::to_string(sc.bytes), ztag = ec.name + "_" + tag;
      t.row("push_" + ztag, human(sc.bytes), "push " + ec.name + " (vs plain raw)", "push_" + tag);
      if (ec.pull)
        t.row("pull_" + ztag, human(sc.bytes), "pull " + ec.name + " (vs plain raw)",
              "pull_" + tag);
    }
  if (!cfg.sizes.empty()) {
    const auto& sc = cfg.sizes.back();
    t.row("adam_push_" + std::to_string(sc.bytes), human(sc.bytes), "push, servers apply Adam",
          "push_" + std::to_string(sc.bytes));
  }
  t.row("pushwait_4096", "4 KiB", "push+wait", "pushwait_4096");
  t.row("many_4096", "4 KiB", "push " + std::to_string(cfg.many_keys) + " keys, wait_all",
        "many_4096");
  t.row("backprop_" + std::to_string(cfg.backprop_keys), "64B-16K",
        "step: " + std::to_string(cfg.backprop_keys) + " pushes, " +
            std::to_string(cfg.backprop_keys) + " pulls",
        "backprop_" + std::to_string(cfg.backprop_keys));
  pingpong_row(t);
  growth_table(cfg, t);
}

// Targets of the small-op and bulk paths, judged on the 1x1 figures.
void judge_targets(bool quick, std::map<std::string, figure>& target_figs) {
  std::printf("\nTargets (1 worker x 1 server)%s:\n", quick ? " -- not judged in --quick" : "");
  if (quick) return;
  auto judge = [&](const std::string& what, double v, double ref, double want, const char* unit) {
    if (v <= 0 || ref == 0)
      return std::printf("  %-44s not measured in this run\n", what.c_str()), void();
    const bool met = ref > 0 ? v / ref >= want : v > want;
    if (ref > 0)
      std::printf("  %-44s %.3f x (%.4g vs %.4g %s), want >= %.2f x: %s\n", what.c_str(), v / ref,
                  v, ref, unit, want, met ? "met" : "NOT met");
    else
      std::printf("  %-44s %.4g %s, want > %.4g: %s\n", what.c_str(), v, unit, want,
                  met ? "met" : "NOT met");
  };
  const std::string big = std::to_string(64 << 20);
  auto f = [&](const std::string& k) { return target_figs.count(k) ? target_figs[k].gb_s : 0.0; };
  auto o = [&](const std::string& k) { return target_figs.count(k) ? target_figs[k].ops_s : 0.0; };
  judge("64 MiB push vs raw TCP", f("1x1push_" + big), f("1x1push_" + big + "#base"), 0.9, "GB/s");
  judge("64 MiB pull vs raw TCP", f("1x1pull_" + big), f("1x1pull_" + big + "#base"), 0.9, "GB/s");
  judge("4 KiB push+wait vs raw 64 B ping-pong", o("1x1pushwait_4096"), o("1x1pingpong"), 0.8,
        "ops/s");
  judge("4 KiB push+wait vs raw 4 KiB push+ack", o("1x1pushwait_4096"), o("1x1pushwait_4096#base"),
        0.8, "ops/s");
  judge("4 KiB pushes, 1000 keys in flight", o("1x1many_4096"), -1, 100000, "ops/s");
  // Growth (issue 12): per-key time of one multi-key call, and how it grows with N.
  auto at_most = [&](const std::string& what, const std::string& fig, double want,
                     const char* unit) {
    if (!target_figs.count(fig) || !target_figs[fig].present)
      return std::printf("  %-44s not measured in this run\n", what.c_str()), void();
    const double v = target_figs[fig].ops_s;
    std::printf("  %-44s %.4g %s, want < %.4g: %s\n", what.c_str(), v, unit, want,
                v < want ? "met" : "NOT met");
  };
  for (const char* w : {"push", "pull"})
    for (std::size_t n : {std::size_t{100000}, std::size_t{1000000}})
      at_most(std::string("multi-key ") + w + " of " + std::to_string(n) + " keys, per key",
              "1x1" + growth_name(w, n), 0.1, "us");
  for (const char* w : {"init", "push", "pull"})
    at_most(std::string("multi-key ") + w + ": per-key time, 1e6 / 1e3 keys",
            std::string("1x1keys_") + w + "_growth", 1.5, "x");
}

}  // namespace
}  // namespace kv_bench

int main(int argc, char** argv) {
  using namespace kv_bench;
  bool quick = false;
  std::string json, only, setups = "1x1,2x2,2x2c", side = "both";
  int reps = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--json" && i + 1 < argc)
      json = argv[++i];
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--setup" && i + 1 < argc)
      setups = argv[++i];
    else if (a == "--side" && i + 1 < argc)
      side = argv[++i];
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(
          stderr,
          "usage: kv_bench [--quick] [--json FILE]   (for profiling: [--only "
          "NAME_PART[,NAME_PART...]]\n"
          "       [--setup 1x1,2x2,2x2c (any of them)] [--side both|kv|raw] [--reps N])\n");
      return 2;
    }
  }
  ::signal(SIGPIPE, SIG_IGN);
  config cfg = make_config(quick);
  cfg.only = only;
  if (reps) cfg.reps = reps;
  std::printf(
      "kv_bench%s: KVStore<dist> (dist_sync, float, no optimizer) vs raw Asio TCP on 127.0.0.1;\n"
      "  real processes: scheduler, servers and workers (one process each) forked from here;\n"
      "  baseline: server and client processes, same bytes to the same servers, same pattern;\n"
      "  each key's bytes from and to a place of their own on both sides, as kvstore's keys.\n"
      "  median of %d repetitions; GB/s = payload bytes / time (1e9 B/s), summed over workers;\n"
      "  cpu = CPU us per op of the worker (client) processes, all threads; cs = their context\n"
      "  switches per op (servers not included); B/op = bytes the kernel saw those processes'\n"
      "  TCP sockets send and receive per op (TCP_INFO). Compressed rows: GB/s of float payload,\n"
      "  compared with the raw baseline moving the same floats plain.\n",
      quick ? " --quick (tiny, targets not judged)" : "", cfg.reps);
  {
    // What the sockets of both sides run (dist_options::tcp_congestion, applied alike).
    std::ifstream f("/proc/sys/net/ipv4/tcp_congestion_control");
    std::string host_cc = "unknown";
    std::getline(f, host_cc);
    const std::string used = congestion_used();
    std::printf(
        "  TCP congestion control: the host's default is %s; kvstore's and the baseline's "
        "sockets run %s (tcp_congestion \"%s\", KVSTORE_TCP_CONGESTION).\n",
        host_cc.c_str(), used.empty() ? host_cc.c_str() : used.c_str(),
        congestion_option().c_str());
  }
  std::fflush(stdout);

  std::vector<result> results;
  bool ok = true;
  struct setup {
    int W, S;
    bool colocated;
    std::string name() const {
      return std::to_string(W) + "x" + std::to_string(S) + (colocated ? "c" : "");
    }
  };
  auto picked = [&](const std::string& name) {  // one of the comma-separated --setup names
    return ("," + setups + ",").find("," + name + ",") != std::string::npos;
  };
  std::map<std::string, figure> target_figs;
  for (setup st : {setup{1, 1, false}, setup{2, 2, false}, setup{2, 2, true}}) {
    if (!picked(st.name())) continue;
    std::vector<sample> kvs, base;
    try {
      const setup_plan plan{.W = st.W,
                            .S = st.S,
                            .colocated = st.colocated,
                            .with_kv = side != "raw",
                            .with_raw = side != "kv",
                            .raw_bytes = baseline_bytes(cfg),
                            .kv_worker = &kv_worker,
                            .raw_worker = &raw_worker};
      ok = run_setup(cfg, plan, kvs, base) && ok;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kv_bench: %s\n", e.what());
      kill_children();
      ok = false;
    }
    if (st.colocated)
      std::printf(
          "\n%d workers x %d colocated servers (workers: %d processes, each serving one shard "
          "on its own thread; kv cpu and kv B/op include the servers)\n",
          st.W, st.S, st.W);
    else
      std::printf("\n%d worker%s x %d server%s (workers: %d process%s)\n", st.W,
                  st.W > 1 ? "s" : "", st.S, st.S > 1 ? "s" : "", st.W, st.W > 1 ? "es" : "");
    setup_table t{st.name(), st.W, kvs, base, results, target_figs};
    print_rows(cfg, t);
    std::fflush(stdout);
  }

  if (cfg.want("adam_loop") && !cfg.sizes.empty())
    results.push_back(adam_loop_bench(cfg.sizes.back().bytes / sizeof(float), quick ? 3 : 9));
  if (cfg.want("convert")) {
    auto conv = conversion_bench(cfg.convert_floats, quick ? 3 : 9);
    results.insert(results.end(), conv.begin(), conv.end());
  }
  judge_targets(quick, target_figs);

  if (!json.empty() && !write_json(json, results)) {
    std::fprintf(stderr, "kv_bench: cannot write %s\n", json.c_str());
    ok = false;
  }
  if (!ok) std::fprintf(stderr, "kv_bench: FAILED (see above)\n");
  return ok ? 0 : 1;
}
