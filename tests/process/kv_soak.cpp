// kv_soak: a load run of a distributed job for a given time, checking that the servers' resident
// memory stays flat and that every value is exactly right at the end.
//
//   kv_soak --seconds S [--workers W] [--servers N] [--keys K] [--sync | --async]
//
// By default two jobs run side by side for S seconds: a dist_sync job and a dist_async job, each
// with its own scheduler (a thread), N server processes (this program re-executed, so their
// memory is their own) and W worker threads doing random push, push_rows, pull and pull_rows over
// K keys of many shapes (one of them sliced over every server). Every pushed value is a small
// integer and the servers run sgd with learning rate -1 (w += the round's sum), so every
// expected value is computable exactly: in dist_sync every worker checks its pulls as it goes
// (all workers' pushes of a step are derived from the step, the worker and the key); in
// dist_async each worker keeps the sum of its own pushes and the values are checked after the
// run. Each server's VmRSS is sampled every second; after a warm-up, the largest value of the
// last third may exceed that of the first third by at most 10% or 8 MiB.
// Exit code: 0 all good, 1 a wrong value or a failed op, 2 memory grew, 3 bad usage.
#include <kvstore/kvstore.hpp>

#include "support/process.hpp"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;
using kvstore::dist;
using kvstore::KVStore;

struct args {
  double seconds = 60;
  int workers = 2, servers = 2, keys = 64;
  bool sync = true, async = true;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(
      stderr,
      "kv_soak: %s\nusage: kv_soak --seconds S [--workers W] [--servers N] [--keys K] [--sync | "
      "--async]\n"
      "  runs a dist_sync and a dist_async job side by side (or only one) for S seconds,\n"
      "  W worker threads and N server processes each, over K keys; checks every value and\n"
      "  that the servers' resident memory stays flat.\n",
      why);
  std::exit(3);
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
std::uint64_t h4(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}
// The increment worker w pushes to row `row` of key k at step s: an integer in [-3, 3].
float grad(int w, std::uint64_t s, int k, std::size_t row) {
  return static_cast<float>(
      static_cast<int>(h4(static_cast<std::uint64_t>(w), s, static_cast<std::uint64_t>(k), row) %
                       7) -
      3);
}

struct key_shape {
  std::size_t rows, len;
};
key_shape shape_of(int k) {
  if (k == 7) return {600, 512};  // 1.2 MB: sliced over every server
  static const key_shape shapes[] = {{1, 16},  {4, 64},   {16, 128}, {64, 64},
                                     {8, 512}, {128, 32}, {2, 1000}, {32, 256}};
  return shapes[k % 8];
}
std::string key_name(int k) { return "soak." + std::to_string(k); }
float initial(int k, std::size_t row) {
  return static_cast<float>((static_cast<std::size_t>(k) + row) % 5);
}

// Distinct rows for worker w at step s of key k (1..8 of them).
std::vector<std::int64_t> rows_for(int w, std::uint64_t s, int k, std::size_t rows) {
  std::uint64_t h = h4(static_cast<std::uint64_t>(w) + 1000, s, static_cast<std::uint64_t>(k), 17);
  const std::size_t n = 1 + h % std::min<std::size_t>(rows, 8);
  std::set<std::int64_t> pick;
  while (pick.size() < n) {
    h = mix(h);
    pick.insert(static_cast<std::int64_t>(h % rows));
  }
  return {pick.begin(), pick.end()};
}

// ---- the server processes ---------------------------------------------------------------------
long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

// ---- one job ------------------------------------------------------------------------------------
struct job {
  args a;
  bool sync;
  std::string name;
  kvstore::dist_options opts;
  std::unique_ptr<kvstore::node_loop> sched;
  std::thread sched_thread;
  std::vector<kvtest::child> servers;
  std::vector<std::vector<long>> rss;  // per server, one sample a second
  std::atomic<long> ops{0};
  std::atomic<bool> failed{false};
  std::mutex m;
  std::string first_error;
  // dist_async: each worker's pushed sums; dist_sync: the replica of rank 0.
  std::vector<std::vector<std::vector<double>>> delta;  // [worker][key][element]
  std::atomic<long> stop_step{LONG_MAX};
  double seconds_run = 0;
  long steps = 0;

  job(const args& a_, bool sync_) : a(a_), sync(sync_), name(sync_ ? "dist_sync" : "dist_async") {
    opts.scheduler_host = "127.0.0.1";
    opts.scheduler_port = 0;
    opts.num_workers = a.workers;
    opts.num_servers = a.servers;
    opts.sync = sync;
    opts.request_timeout = std::chrono::milliseconds(60'000);
    opts.barrier_timeout = std::chrono::milliseconds(120'000);
    opts.threads = 2;
    auto sched_opts = opts;
    sched_opts.role = kvstore::role::scheduler;
    sched = std::make_unique<kvstore::node_loop>(sched_opts);
    opts.scheduler_port = sched->port();
    sched_thread = std::thread([this] {
      try {
        sched->run();
      } catch (const std::exception& e) {
        fail(std::string("scheduler: ") + e.what());
      }
    });
    for (int s = 0; s < a.servers; ++s) {
      auto env = kvtest::clean_environment();
      env.insert(env.end(), {"KVSTORE_ROLE=server",
                             "KVSTORE_SCHEDULER=127.0.0.1:" + std::to_string(opts.scheduler_port),
                             "KVSTORE_NUM_WORKERS=" + std::to_string(a.workers),
                             "KVSTORE_NUM_SERVERS=" + std::to_string(a.servers),
                             "KVSTORE_TYPE=" + name, "KVSTORE_RANK=" + std::to_string(s)});
      try {
        servers.push_back(kvtest::spawn({"/proc/self/exe", "--serve"}, std::move(env)));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kv_soak: %s\n", e.what());
        std::exit(1);
      }
    }
    rss.resize(static_cast<std::size_t>(a.servers));
    delta.resize(static_cast<std::size_t>(a.workers));
  }
  ~job() {
    sched->stop();
    if (sched_thread.joinable()) sched_thread.join();
  }

  void fail(const std::string& e) {
    std::lock_guard lk(m);
    if (!failed.exchange(true)) first_error = e;
    std::fprintf(stderr, "kv_soak %s: %s\n", name.c_str(), e.c_str());
  }

  void sample() {
    for (std::size_t s = 0; s < servers.size(); ++s)
      if (servers[s].pid() > 0) {
        long r = rss_kib(servers[s].pid());
        if (r > 0) rss[s].push_back(r);
      }
  }

  static std::vector<std::vector<double>> zero_model(int keys) {
    std::vector<std::vector<double>> v(static_cast<std::size_t>(keys));
    for (int k = 0; k < keys; ++k)
      v[static_cast<std::size_t>(k)].assign(shape_of(k).rows * shape_of(k).len, 0.0);
    return v;
  }

  void worker(int w, clk::time_point end, std::barrier<>& sync_point) {
    try {
      auto o = opts;
      o.rank_hint = w;
      KVStore<dist> kv(o);
      for (int k = 0; k < a.keys; ++k) {
        const auto sh = shape_of(k);
        std::vector<float> v(sh.rows * sh.len);
        for (std::size_t r = 0; r < sh.rows; ++r)
          std::fill_n(v.begin() + static_cast<std::ptrdiff_t>(r * sh.len), sh.len, initial(k, r));
        kv.init(key_name(k), v, sh.len);
      }
      kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
      auto& mine = delta[static_cast<std::size_t>(w)];
      mine = zero_model(a.keys);
      if (sync)
        run_sync(kv, w, end, mine);
      else
        run_async(kv, w, end, mine);
      kv.wait_all();
      kv.barrier();
      sync_point.arrive_and_wait();  // every worker's deltas are final
      if (w == 0) check_final(kv);
      kv.barrier();
    } catch (const std::exception& e) {
      fail("worker " + std::to_string(w) + ": " + e.what());
      sync_point.arrive_and_drop();
    }
  }

  // dist_sync: step s pushes the same keys from every worker (chosen by s), each worker its own
  // values; after the round every worker checks its pulls against the replica `model`.
  void run_sync(KVStore<dist>& kv, int w, clk::time_point end,
                std::vector<std::vector<double>>& model) {
    for (long s = 0;; ++s) {
      if (clk::now() >= end) {
        long none = LONG_MAX;
        stop_step.compare_exchange_strong(none, s + 2);  // every worker is at most one step ahead
      }
      if (s >= stop_step.load() || failed) {
        if (w == 0) steps = s;
        return;
      }
      std::uint64_t h = mix(static_cast<std::uint64_t>(s) * 7919 + 1);
      const int m = 1 + static_cast<int>(h % 4);
      std::set<int> ks;
      while (static_cast<int>(ks.size()) < std::min(m, a.keys)) {
        h = mix(h);
        ks.insert(static_cast<int>(h % static_cast<std::uint64_t>(a.keys)));
      }
      std::vector<std::vector<float>> bufs;
      std::vector<std::vector<std::int64_t>> rowbufs;
      bufs.reserve(ks.size() * 2);
      rowbufs.reserve(ks.size() * 2);
      std::vector<std::pair<int, bool>> chosen;  // key, dense?
      for (int k : ks) {
        const auto sh = shape_of(k);
        const bool dense = (mix(h ^ static_cast<std::uint64_t>(k)) & 1) != 0;
        chosen.emplace_back(k, dense);
        if (dense) {
          auto& g = bufs.emplace_back(sh.rows * sh.len);
          for (std::size_t r = 0; r < sh.rows; ++r)
            std::fill_n(g.begin() + static_cast<std::ptrdiff_t>(r * sh.len), sh.len,
                        grad(w, static_cast<std::uint64_t>(s), k, r));
          kv.push(key_name(k), g);
        } else {
          auto& rows = rowbufs.emplace_back(rows_for(w, static_cast<std::uint64_t>(s), k, sh.rows));
          auto& g = bufs.emplace_back(rows.size() * sh.len);
          for (std::size_t i = 0; i < rows.size(); ++i)
            std::fill_n(
                g.begin() + static_cast<std::ptrdiff_t>(i * sh.len), sh.len,
                grad(w, static_cast<std::uint64_t>(s), k, static_cast<std::size_t>(rows[i])));
          kv.push_rows(key_name(k), rows, g);
        }
        ops.fetch_add(1, std::memory_order_relaxed);
      }
      kv.wait_all();
      // Every worker's contribution to this round, in the replica.
      for (auto [k, dense] : chosen) {
        const auto sh = shape_of(k);
        auto& mk = model[static_cast<std::size_t>(k)];
        for (int v = 0; v < a.workers; ++v) {
          if (dense) {
            for (std::size_t r = 0; r < sh.rows; ++r) {
              const double g = grad(v, static_cast<std::uint64_t>(s), k, r);
              for (std::size_t j = 0; j < sh.len; ++j) mk[r * sh.len + j] += g;
            }
          } else {
            for (auto r : rows_for(v, static_cast<std::uint64_t>(s), k, sh.rows)) {
              const double g =
                  grad(v, static_cast<std::uint64_t>(s), k, static_cast<std::size_t>(r));
              for (std::size_t j = 0; j < sh.len; ++j)
                mk[static_cast<std::size_t>(r) * sh.len + j] += g;
            }
          }
        }
      }
      // Pull them back (the whole key or some rows) and check.
      std::vector<std::vector<float>> outs;
      std::vector<std::vector<std::int64_t>> pulled_rows;
      outs.reserve(chosen.size());
      pulled_rows.reserve(chosen.size());
      for (auto [k, dense] : chosen) {
        const auto sh = shape_of(k);
        auto& rows = pulled_rows.emplace_back();
        if ((s + k) % 2 == 0) {
          kv.pull(key_name(k), outs.emplace_back(sh.rows * sh.len));
        } else {
          rows = rows_for(w + 77, static_cast<std::uint64_t>(s), k, sh.rows);
          kv.pull_rows(key_name(k), rows, outs.emplace_back(rows.size() * sh.len));
        }
        ops.fetch_add(1, std::memory_order_relaxed);
      }
      kv.wait_all();
      for (std::size_t i = 0; i < chosen.size(); ++i) {
        const int k = chosen[i].first;
        const auto sh = shape_of(k);
        const auto& mk = model[static_cast<std::size_t>(k)];
        auto want = [&](std::size_t row, std::size_t j) {
          return static_cast<float>(initial(k, row) + mk[row * sh.len + j]);
        };
        if (pulled_rows[i].empty()) {
          for (std::size_t e = 0; e < outs[i].size(); ++e)
            if (outs[i][e] != want(e / sh.len, e % sh.len))
              throw std::runtime_error("step " + std::to_string(s) + ": " + key_name(k) + "[" +
                                       std::to_string(e) + "] = " + std::to_string(outs[i][e]) +
                                       ", want " + std::to_string(want(e / sh.len, e % sh.len)));
        } else {
          for (std::size_t q = 0; q < pulled_rows[i].size(); ++q)
            for (std::size_t j = 0; j < sh.len; ++j)
              if (outs[i][q * sh.len + j] != want(static_cast<std::size_t>(pulled_rows[i][q]), j))
                throw std::runtime_error("step " + std::to_string(s) + ": row " +
                                         std::to_string(pulled_rows[i][q]) + " of " + key_name(k) +
                                         " is wrong");
        }
      }
    }
  }

  // dist_async: random ops of this worker alone, a few in flight at a time; its pushes summed in
  // `mine` for the final check.
  void run_async(KVStore<dist>& kv, int w, clk::time_point end,
                 std::vector<std::vector<double>>& mine) {
    std::uint64_t h = mix(static_cast<std::uint64_t>(w) + 4242);
    std::uint64_t it = 0;
    while (clk::now() < end && !failed) {
      std::vector<std::vector<float>> bufs;
      std::vector<std::vector<std::int64_t>> rowbufs;
      bufs.reserve(8);
      rowbufs.reserve(8);
      for (int b = 0; b < 8; ++b, ++it) {
        h = mix(h);
        const int k = static_cast<int>(h % static_cast<std::uint64_t>(a.keys));
        const auto sh = shape_of(k);
        auto& mk = mine[static_cast<std::size_t>(k)];
        switch ((h >> 20) % 4) {
          case 0: {  // dense push
            auto& g = bufs.emplace_back(sh.rows * sh.len);
            for (std::size_t r = 0; r < sh.rows; ++r) {
              const float x = grad(w, it, k, r);
              std::fill_n(g.begin() + static_cast<std::ptrdiff_t>(r * sh.len), sh.len, x);
              for (std::size_t j = 0; j < sh.len; ++j) mk[r * sh.len + j] += x;
            }
            kv.push(key_name(k), g);
            break;
          }
          case 1: {  // push_rows
            auto& rows = rowbufs.emplace_back(rows_for(w, it, k, sh.rows));
            auto& g = bufs.emplace_back(rows.size() * sh.len);
            for (std::size_t i = 0; i < rows.size(); ++i) {
              const float x = grad(w, it, k, static_cast<std::size_t>(rows[i]));
              std::fill_n(g.begin() + static_cast<std::ptrdiff_t>(i * sh.len), sh.len, x);
              for (std::size_t j = 0; j < sh.len; ++j)
                mk[static_cast<std::size_t>(rows[i]) * sh.len + j] += x;
            }
            kv.push_rows(key_name(k), rows, g);
            break;
          }
          case 2:
            kv.pull(key_name(k), bufs.emplace_back(sh.rows * sh.len));
            break;
          default: {
            auto& rows = rowbufs.emplace_back(rows_for(w + 99, it, k, sh.rows));
            kv.pull_rows(key_name(k), rows, bufs.emplace_back(rows.size() * sh.len));
            break;
          }
        }
        ops.fetch_add(1, std::memory_order_relaxed);
      }
      kv.wait_all();
      // A pulled value is a sum of small integers: it must be one.
      for (auto& b : bufs)
        for (float x : b)
          if (x != static_cast<float>(static_cast<long>(x)))
            throw std::runtime_error("a pulled value is not an integer");
    }
    if (w == 0) steps = static_cast<long>(it);
  }

  // Rank 0, after every worker finished: every element of every key is exactly right.
  void check_final(KVStore<dist>& kv) {
    long wrong = 0, checked = 0;
    for (int k = 0; k < a.keys; ++k) {
      const auto sh = shape_of(k);
      std::vector<float> out(sh.rows * sh.len);
      kv.pull(key_name(k), out).wait();
      for (std::size_t e = 0; e < out.size(); ++e) {
        double want = initial(k, e / sh.len);
        if (sync)
          want += delta[0][static_cast<std::size_t>(k)]
                       [e];  // rank 0's replica holds every worker's pushes
        else
          for (auto& d : delta) want += d[static_cast<std::size_t>(k)][e];
        ++checked;
        if (static_cast<double>(out[e]) != want) {
          if (wrong++ < 5)
            std::fprintf(stderr, "kv_soak %s: %s[%zu] = %g, want %g\n", name.c_str(),
                         key_name(k).c_str(), e, static_cast<double>(out[e]), want);
        }
      }
    }
    std::printf("kv_soak %s: final check: %ld values, %ld wrong\n", name.c_str(), checked, wrong);
    if (wrong) fail(std::to_string(wrong) + " wrong values at the end");
  }
};

// RSS is flat when, after the warm-up, the last third's largest sample is within 10% or 8 MiB of
// the first third's largest.
bool rss_flat(const std::vector<long>& kib, std::string& summary) {
  const std::size_t warm = std::max<std::size_t>(3, kib.size() / 10);
  char line[256];
  if (kib.size() < warm + 6) {
    std::snprintf(line, sizeof line, "%zu samples: too few to judge", kib.size());
    summary = line;
    return true;
  }
  std::vector<long> v(kib.begin() + static_cast<std::ptrdiff_t>(warm), kib.end());
  const std::size_t third = v.size() / 3;
  const long first = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(third));
  const long last = *std::max_element(v.end() - static_cast<std::ptrdiff_t>(third), v.end());
  const long lo = *std::min_element(kib.begin(), kib.end()),
             hi = *std::max_element(kib.begin(), kib.end());
  const long allowed = std::max<long>(first / 10, 8 * 1024);
  std::snprintf(
      line, sizeof line,
      "%zu samples, min %.1f MiB, max %.1f MiB, first-third max %.1f MiB, last-third max %.1f MiB "
      "(growth %+.1f MiB, allowed %.1f)",
      kib.size(), lo / 1024.0, hi / 1024.0, first / 1024.0, last / 1024.0, (last - first) / 1024.0,
      allowed / 1024.0);
  summary = line;
  return last - first <= allowed;
}

int serve() {
  try {
    auto o = kvstore::dist_options::from_env();
    o.role = kvstore::role::server;
    kvstore::serve(o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_soak server: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--serve") == 0) return serve();
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value for " + f).c_str());
      return argv[++i];
    };
    if (f == "--seconds")
      a.seconds = std::atof(next());
    else if (f == "--workers")
      a.workers = std::atoi(next());
    else if (f == "--servers")
      a.servers = std::atoi(next());
    else if (f == "--keys")
      a.keys = std::atoi(next());
    else if (f == "--sync")
      a.async = false;
    else if (f == "--async")
      a.sync = false;
    else if (f == "-h" || f == "--help")
      usage("help");
    else
      usage(("unknown argument " + f).c_str());
  }
  if (a.seconds <= 0 || a.workers < 1 || a.servers < 1 || a.keys < 1 || (!a.sync && !a.async))
    usage("bad arguments");

  std::vector<std::unique_ptr<job>> jobs;
  if (a.sync) jobs.push_back(std::make_unique<job>(a, true));
  if (a.async) jobs.push_back(std::make_unique<job>(a, false));
  std::printf(
      "kv_soak: %.0f s, %zu job(s) (%s), %d workers and %d server processes each, %d keys\n",
      a.seconds, jobs.size(),
      a.sync && a.async ? "dist_sync + dist_async" : (a.sync ? "dist_sync" : "dist_async"),
      a.workers, a.servers, a.keys);
  std::fflush(stdout);

  const auto start = clk::now();
  const auto end =
      start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(a.seconds));
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    auto next = clk::now();
    while (sampling) {
      for (auto& j : jobs) j->sample();
      next += std::chrono::seconds(1);
      while (sampling && clk::now() < next)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<std::barrier<>>> points;
  for (auto& j : jobs) {
    points.push_back(std::make_unique<std::barrier<>>(a.workers));
    for (int w = 0; w < a.workers; ++w)
      threads.emplace_back([&j, w, end, p = points.back().get()] { j->worker(w, end, *p); });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(clk::now() - start).count();
  sampling = false;
  sampler.join();

  int rc = 0;
  long total = 0;
  for (auto& j : jobs) {
    for (auto& s : j->servers) {
      const int code = s.wait_exit(std::chrono::seconds(20));
      if (code != 0) {
        std::printf("kv_soak %s: a server ended with %d\n", j->name.c_str(), code);
        rc = 1;
      }
    }
    const long ops = j->ops.load();
    total += ops;
    std::printf("kv_soak %s: %ld ops in %.1f s = %.0f ops/s (%ld %s)\n", j->name.c_str(), ops, secs,
                ops / secs, j->steps, j->sync ? "sync steps" : "async ops of worker 0");
    for (std::size_t s = 0; s < j->rss.size(); ++s) {
      std::string summary;
      const bool flat = rss_flat(j->rss[s], summary);
      std::printf("kv_soak %s: server %zu RSS: %s%s\n", j->name.c_str(), s, summary.c_str(),
                  flat ? "" : "  GROWING");
      if (!flat && rc == 0) rc = 2;
    }
    if (j->failed) {
      std::printf("kv_soak %s: FAILED: %s\n", j->name.c_str(), j->first_error.c_str());
      rc = 1;
    }
  }
  std::printf("kv_soak: %ld ops in %.1f s = %.0f ops/s; %s\n", total, secs, total / secs,
              rc == 0 ? "every value exact, memory flat"
                      : (rc == 1 ? "WRONG VALUES OR FAILED OPS" : "MEMORY GREW"));
  return rc;
}
