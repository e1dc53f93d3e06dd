// Fault tests with real processes: every case is bounded and asserts an error or a recovery,
// never a hang.
//  - a server paused with SIGSTOP: requests fail by their deadline naming it; after SIGCONT new
//    requests succeed again;
//  - the scheduler killed mid-training: push/pull go on, barrier and num_dead_node report it,
//    the servers end once the workers are gone;
//  - a worker killed mid-round: with leave_group the survivors' rounds complete with exactly the
//    survivors' pushes; with KVSTORE_ON_WORKER_DEATH=fail they get node_dead errors naming it;
//  - a server SIGKILLed mid-training of the real demo (train_mnist) and restarted with its rank
//    and checkpoint directory: training completes with the accuracy of an undisturbed run;
//  - a slow, lossy link between network namespaces made by the test (netem, or where the kernel
//    has no netem, a rate limit plus random drops by nftables): training is exact; a link that
//    drops everything fails requests by their deadline naming the server;
//  - garbage clients connecting throughout a training run: the values stay exact.
// Every process started here is killed and reaped by a guard, every namespace deleted.
#include <kvstore/kvstore.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/process.hpp"

#include <kvstore/wire/frame.hpp>  // the header's fields, for hand-made frames

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <latch>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef KV_SERVER_PATH
#error "KV_SERVER_PATH must name the kv_server binary"
#endif
#ifndef TRAIN_MNIST_PATH
#error "TRAIN_MNIST_PATH must name the train_mnist binary"
#endif

using namespace std::chrono_literals;
using kvstore::dist;
using kvstore::KVStore;
using clk = std::chrono::steady_clock;

namespace {

std::string self_exe;

double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

using kvtest::free_port;
using kvtest::read_file;
using kvtest::wait_until;

// A child process with a name and a log (its stdout and stderr); killed and reaped by its guard.
struct proc : kvtest::child {
  std::string name, log;
  std::string output() const { return read_file(log); }
};

// Starts argv with exactly `env` (plus PATH and KVSTORE_LOG=1), stdout and stderr to `log`.
proc spawn(const std::string& name, std::vector<std::string> argv, std::vector<std::string> env,
           const std::string& log) {
  env.push_back("PATH=/usr/sbin:/usr/bin:/sbin:/bin");
  env.push_back("KVSTORE_LOG=1");
  return {kvtest::spawn(std::move(argv), std::move(env), log, log), name, log};
}

// The environment of a job's scheduler, servers or workers.
std::vector<std::string> job_env(const std::string& role, const std::string& sched, int workers,
                                 int servers, std::vector<std::string> more = {}) {
  std::vector<std::string> e = {"KVSTORE_ROLE=" + role, "KVSTORE_SCHEDULER=" + sched,
                                "KVSTORE_NUM_WORKERS=" + std::to_string(workers),
                                "KVSTORE_NUM_SERVERS=" + std::to_string(servers),
                                "KVSTORE_CONNECT_TIMEOUT_MS=30000"};
  e.insert(e.end(), more.begin(), more.end());
  return e;
}

// A scheduler and servers as kv_server processes on 127.0.0.1.
struct process_job {
  kvtest::temp_dir dir{"kvstore-faults"};
  std::uint16_t port = free_port();
  std::string sched_addr = "127.0.0.1:" + std::to_string(port);
  int workers, servers;
  proc scheduler;
  std::vector<proc> server;
  process_job(int w, int s, const std::vector<std::string>& sched_env,
              const std::vector<std::string>& server_env)
      : workers(w), servers(s) {
    scheduler =
        spawn("scheduler", {KV_SERVER_PATH, "--role", "scheduler", "--port", std::to_string(port)},
              job_env("scheduler", sched_addr, w, s, sched_env), dir / "scheduler.log");
    for (int i = 0; i < s; ++i) start_server(i, server_env);
  }
  void start_server(int rank, std::vector<std::string> env) {
    env.push_back("KVSTORE_RANK=" + std::to_string(rank));
    auto p =
        spawn("server " + std::to_string(rank), {KV_SERVER_PATH, "--role", "server"},
              job_env("server", sched_addr, workers, servers, env),
              dir / ("server" + std::to_string(rank) + "-" + std::to_string(starts_++) + ".log"));
    if (static_cast<std::size_t>(rank) < server.size())
      server[static_cast<std::size_t>(rank)] = std::move(p);
    else
      server.push_back(std::move(p));
  }
  // A worker's options for this job (in this process).
  kvstore::dist_options worker(int rank) const {
    auto o = kvtest::test_options(workers, servers);
    o.scheduler_port = port;
    o.rank_hint = rank;
    return o;
  }
  std::string logs() const {
    std::string s = "--- scheduler\n" + scheduler.output();
    for (auto& p : server) s += "--- " + p.name + "\n" + p.output();
    return s;
  }
  int starts_ = 0;
};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kvstore::error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Runs f on `n` threads (index as argument); rethrows the first exception after all joined.
template <class F>
void on_threads(int n, F f) {
  std::vector<std::thread> ts;
  std::mutex m;
  std::exception_ptr first;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      try {
        f(i);
      } catch (...) {
        std::lock_guard lk(m);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

// ---- the worker-death job: 3 workers, 2 servers, keys "big" (sliced over both) and "small" ----
constexpr std::size_t big_n = 300'000, small_n = 1000;  // 1.2 MB > slice_bytes: on both servers
constexpr int all_rounds = 12, child_rounds = 4;
// Each worker pushes rank + 1 a round; w += sum (sgd lr -1). Worker 2 does child_rounds rounds.
float after_round(int r) {
  float v = 0;
  for (int i = 0; i <= r; ++i) v += i < child_rounds ? 6.f : 3.f;
  return v;
}
void death_job_setup(KVStore<dist>& kv) {
  kv.init("big", std::vector<float>(big_n, 0.f));
  kv.init("small", std::vector<float>(small_n, 0.f));
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
}
void death_job_round(KVStore<dist>& kv, int r, std::vector<float>& b, std::vector<float>& s) {
  const std::vector<float> gb(big_n, static_cast<float>(kv.rank() + 1)),
      gs(small_n, static_cast<float>(kv.rank() + 1));
  auto p1 = kv.push("big", gb);
  auto p2 = kv.push("small", gs);
  p1.wait();
  p2.wait();
  kv.pull("big", b).wait();
  kv.pull("small", s).wait();
  const float want = after_round(r);
  for (float x : b)
    if (x != want)
      throw std::runtime_error("round " + std::to_string(r) + ": big has " + std::to_string(x) +
                               ", want " + std::to_string(want));
  for (float x : s)
    if (x != want)
      throw std::runtime_error("round " + std::to_string(r) + ": small has " + std::to_string(x));
}

// Child mode: worker rank 2 from the environment; child_rounds rounds, "ready", then sleeps.
int child_death_worker() {
  try {
    auto* kv = new KVStore<dist>();  // never destroyed: it is killed, not closed
    death_job_setup(*kv);
    std::vector<float> b(big_n), s(small_n);
    for (int r = 0; r < child_rounds; ++r) death_job_round(*kv, r, b, s);
    std::printf("ready\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(120s);
    return 0;
  } catch (const std::exception& e) {
    std::printf("child failed: %s\n", e.what());
    return 1;
  }
}

// ---- the namespace worker: exact training over a lossy link, then a dead link ---------------
// Child mode, in the worker namespace: trains, prints "trained", waits for `gate` (a file) to
// appear, then expects a pull to fail by its deadline naming server 0.
int child_net_worker(const std::string& gate) {
  try {
    auto o = kvstore::dist_options::from_env();
    o.barrier_before_exit = false;
    auto* kv = new KVStore<dist>(o);  // the link dies under it: it is not closed gracefully
    std::vector<std::string> keys = {"a", "b", "c", "d"};
    const std::vector<std::size_t> sizes = {1000, 20'000, 3000, 64};
    for (std::size_t i = 0; i < keys.size(); ++i)
      kv->init(keys[i], std::vector<float>(sizes[i], 0.f));
    kv->set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
    const int rounds = 40;
    const auto t0 = clk::now();
    std::vector<std::vector<float>> out(keys.size()), grads(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      out[i].resize(sizes[i]);
      grads[i].assign(sizes[i], static_cast<float>(i + 1));
    }
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        kv->push(keys[i], grads[i]);  // the buffers live until wait_all
        kv->pull(keys[i], out[i]);
      }
      kv->wait_all();
      for (std::size_t i = 0; i < keys.size(); ++i)
        for (float x : out[i])
          if (x != static_cast<float>((i + 1) * static_cast<std::size_t>(r + 1)))
            throw std::runtime_error("round " + std::to_string(r) + " key " + keys[i] + ": " +
                                     std::to_string(x));
    }
    std::printf("trained %d rounds exactly in %.2f s\n", rounds, since(t0));
    std::fflush(stdout);
    if (!wait_until([&] { return std::filesystem::exists(gate); }, 60s))
      throw std::runtime_error("no gate");
    std::vector<float> x(sizes[0]);
    const auto t1 = clk::now();
    std::string err = error_of([&] { kv->pull(keys[0], x).wait(); });
    std::printf("dead link: after %.2f s: %s\n", since(t1), err.c_str());
    std::fflush(stdout);
    _exit(err.empty() ? 3 : 0);
  } catch (const std::exception& e) {
    std::printf("child failed: %s\n", e.what());
    std::fflush(stdout);
    _exit(1);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
TEST_CASE(
    "a server paused with SIGSTOP: requests fail by their deadline naming it; after SIGCONT they "
    "succeed" *
    doctest::timeout(90)) {
  // The scheduler declares the paused server dead after 1.5 s of silence (its own options, from
  // the environment); the worker's requests have a 2 s deadline.
  process_job job(1, 1, {"KVSTORE_HEARTBEAT_MS=100", "KVSTORE_DEAD_TIMEOUT_MS=1500"},
                  {"KVSTORE_HEARTBEAT_MS=100", "KVSTORE_DEAD_TIMEOUT_MS=1500"});
  auto o = job.worker(0);
  o.request_timeout = 2000ms;
  {
    KVStore<dist> kv(o);
    std::vector<float> g(1000, 1.f), out(1000);
    kv.init("w", std::vector<float>(1000, 0.f));
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
    kv.push("w", g).wait();
    kv.pull("w", out).wait();
    REQUIRE(out[0] == 1.f);

    REQUIRE(::kill(job.server[0].pid(), SIGSTOP) == 0);
    auto t0 = clk::now();
    const std::string push_err = error_of([&] { kv.push("w", g).wait(); });
    const double push_s = since(t0);
    MESSAGE("paused server, push: after " << push_s << " s: " << push_err);
    CHECK(has(push_err, "server 0 (node 8)"));
    CHECK(push_s < 2.0 + 1.5);
    t0 = clk::now();
    const std::string pull_err = error_of([&] { kv.pull("w", out).wait(); });
    MESSAGE("paused server, pull: after " << since(t0) << " s: " << pull_err);
    CHECK(has(pull_err, "server 0 (node 8)"));
    CHECK(since(t0) < 2.0 + 1.5);
    CHECK(kv.num_dead_node(2, 1) == 1);
    kv.barrier();  // the scheduler and the workers are unaffected

    REQUIRE(::kill(job.server[0].pid(), SIGCONT) == 0);
    t0 = clk::now();
    CHECK(wait_until([&] { return kv.num_dead_node(2, 1) == 0; }, 10s));
    MESSAGE("resumed server heard from again after " << since(t0) << " s");
    kv.push("w", g).wait();
    kv.pull("w", out).wait();
    // The push that timed out was still in the socket: the resumed server applied it (a
    // deadline error means "outcome unknown"), exactly once, before the new one.
    CHECK(out[0] == 3.f);
    CHECK(out[999] == 3.f);
  }
  CHECK_MESSAGE(job.server[0].wait_exit(15s) == 0, job.logs());
  CHECK(job.scheduler.wait_exit(15s) == 0);
}

TEST_CASE(
    "the scheduler killed mid-training: push/pull go on, barrier and num_dead_node report it, "
    "servers end" *
    doctest::timeout(90)) {
  process_job job(2, 2, {"KVSTORE_HEARTBEAT_MS=100"}, {"KVSTORE_HEARTBEAT_MS=100"});
  std::latch trained(2), killed(1);
  std::atomic<bool> killed_flag{false};
  std::thread killer([&] {
    if (!wait_until([&] { return trained.try_wait(); }, 60s)) {
      killed.count_down();
      return;
    }
    ::kill(job.scheduler.pid(), SIGKILL);
    CHECK(job.scheduler.wait_exit(5s) == 128 + SIGKILL);
    killed_flag = true;
    killed.count_down();
  });
  try {
    on_threads(2, [&](int w) {
      auto o = job.worker(w);
      KVStore<dist> kv(o);
      const std::size_t n = 300'000;  // sliced over both servers
      std::vector<float> g(n, static_cast<float>(w + 1)), out(n);
      kv.init("x", std::vector<float>(n, 0.f));
      kv.init("rows", std::vector<float>(64 * 8, 0.f), 8);
      kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
      const std::vector<std::int64_t> rows{1, 40, 63};
      std::vector<float> rg(3 * 8, 1.f), rout(3 * 8);
      auto round = [&](int r) {
        kv.push("x", g).wait();
        kv.push_rows("rows", rows, rg).wait();
        kv.pull("x", out).wait();
        kv.pull_rows("rows", rows, rout).wait();
        REQUIRE(std::all_of(out.begin(), out.end(),
                            [&](float v) { return v == 3.f * static_cast<float>(r + 1); }));
        REQUIRE(std::all_of(rout.begin(), rout.end(),
                            [&](float v) { return v == 2.f * static_cast<float>(r + 1); }));
      };
      int r = 0;
      for (; r < 5; ++r) round(r);
      trained.count_down();
      killed.wait();
      REQUIRE(killed_flag.load());
      for (; r < 15; ++r) round(r);  // the servers outlive the scheduler
      auto t0 = clk::now();
      const std::string err = error_of([&] { kv.barrier(); });
      MESSAGE("worker " << w << ": barrier without a scheduler: " << err);
      CHECK(has(err, "scheduler"));
      CHECK(since(t0) < 5.0);
      CHECK(kv.num_dead_node(1) == 1);
      // The destructor's barrier fails at once too (logged): no hang on the way out.
    });
  } catch (...) {
    if (killer.joinable()) killer.join();
    throw;
  }
  killer.join();
  for (auto& s : job.server) CHECK_MESSAGE(s.wait_exit(15s) == 0, job.logs());
}

namespace {
// The worker-death job with on_worker_death from the environment of every process.
void worker_death_case(bool leave) {
  const std::string mode = std::string("KVSTORE_ON_WORKER_DEATH=") + (leave ? "leave" : "fail");
  process_job job(3, 2, {"KVSTORE_HEARTBEAT_MS=100", "KVSTORE_DEAD_TIMEOUT_MS=3000", mode},
                  {"KVSTORE_HEARTBEAT_MS=100", mode});
  proc child = spawn(
      "worker 2", {self_exe, "--fault-child", "death"},
      job_env("worker", job.sched_addr, 3, 2, {"KVSTORE_RANK=2", mode, "KVSTORE_HEARTBEAT_MS=100"}),
      job.dir / "worker2.log");
  std::atomic<int> at_round[2] = {0, 0};
  std::atomic<bool> stop{false};
  std::thread killer([&] {
    // Mid-round: the child did its rounds and sleeps; both survivors' next pushes are waiting.
    const bool ready = wait_until(
        [&] {
          return stop || (has(child.output(), "ready\n") && at_round[0] > child_rounds &&
                          at_round[1] > child_rounds);
        },
        60s);
    if (!ready || stop) return;
    std::this_thread::sleep_for(300ms);
    ::kill(child.pid(), SIGKILL);
  });
  kvtest::join_on_exit<bool> join_killer{killer, stop, true};
  on_threads(2, [&](int w) {
    auto o = job.worker(w);
    o.on_worker_death = leave ? kvstore::worker_death::leave_group : kvstore::worker_death::fail;
    KVStore<dist> kv(o);
    death_job_setup(kv);
    std::vector<float> b(big_n), s(small_n);
    for (int r = 0; r < all_rounds; ++r) {
      at_round[w] = r + 1;
      if (leave || r < child_rounds) {
        death_job_round(kv, r, b, s);
        continue;
      }
      // fail: the round the dead worker never joins fails, naming it.
      const std::vector<float> gb(big_n, 1.f);
      const auto t0 = clk::now();
      const std::string err = error_of([&] { kv.push("big", gb).wait(); });
      MESSAGE("worker " << w << ": push after worker 2 died: " << err);
      CHECK(has(err, "worker 2 (node 13)"));
      CHECK(since(t0) < 10.0);
      const std::string berr = error_of([&] { kv.barrier(); });
      CHECK(has(berr, "worker 2 (node 13)"));
      CHECK(kv.num_dead_node(4) == 1);
      kv.set_barrier_before_exit(false);
      return;
    }
    // leave_group: every round completed; the last ones hold only the survivors' pushes.
    CHECK(b[0] == 4 * 6.f + 8 * 3.f);
    CHECK(s[small_n - 1] == 4 * 6.f + 8 * 3.f);
    kv.barrier();  // barriers go on without the dead worker
    CHECK(kv.num_dead_node(4) == 1);
  });
  CHECK_MESSAGE(child.wait_exit(1s) == 128 + SIGKILL, child.output());
  for (auto& p : job.server) CHECK_MESSAGE(p.wait_exit(15s) == 0, job.logs());
  CHECK(job.scheduler.wait_exit(15s) == 0);
}
}  // namespace

TEST_CASE(
    "a worker SIGKILLed mid-round with on_worker_death=leave: the survivors' rounds complete "
    "exactly" *
    doctest::timeout(90)) {
  worker_death_case(true);
}

TEST_CASE(
    "a worker SIGKILLed mid-round with KVSTORE_ON_WORKER_DEATH=fail: node_dead errors naming it" *
    doctest::timeout(90)) {
  worker_death_case(false);
}

namespace {
// "done: test accuracy 0.8123, ..." in a train_mnist log; -1 when absent.
double final_accuracy(const std::string& log) {
  auto at = log.find("done: test accuracy ");
  if (at == std::string::npos) return -1;
  return std::atof(log.c_str() + at + std::strlen("done: test accuracy "));
}
double training_seconds(const std::string& log) {
  auto at = log.find(" s of training");
  if (at == std::string::npos) return -1;
  auto from = log.rfind("over ", at);
  return std::atof(log.c_str() + from + 5);
}

struct mnist_run {
  double accuracy = -1, seconds = -1;
  std::string log;
};

// train_mnist with 2 workers and 2 servers (processes); with kill_at >= 0, server 1 is SIGKILLed
// kill_at seconds into training and restarted with the same rank and checkpoint directory.
mnist_run run_mnist(double kill_at) {
  const std::vector<std::string> server_env = {"KVSTORE_HEARTBEAT_MS=200",
                                               "KVSTORE_CHECKPOINT_ROUNDS=1"};
  process_job job(2, 2, {"KVSTORE_HEARTBEAT_MS=200"}, {});
  const std::string ckpt = "KVSTORE_CHECKPOINT_DIR=" + job.dir / "ckpt";
  auto senv = server_env;
  senv.push_back(ckpt);
  job.server.clear();
  for (int s = 0; s < 2; ++s) job.start_server(s, senv);
  std::vector<proc> workers;
  for (int w = 0; w < 2; ++w)
    workers.push_back(
        spawn("worker " + std::to_string(w),
              {TRAIN_MNIST_PATH, "--limit", "12000", "--epochs", "2", "--threads", "1"},
              job_env("worker", job.sched_addr, 2, 2,
                      {"KVSTORE_RANK=" + std::to_string(w), "KVSTORE_HEARTBEAT_MS=200",
                       "KVSTORE_SERVER_RESTART_WAIT_MS=30000", "KVSTORE_REQUEST_TIMEOUT_MS=60000"}),
              job.dir / ("worker" + std::to_string(w) + ".log")));
  mnist_run res;
  if (kill_at >= 0) {
    REQUIRE_MESSAGE(
        wait_until([&] { return has(workers[0].output(), "train_mnist: dist_sync"); }, 60s),
        workers[0].output());
    std::this_thread::sleep_for(std::chrono::duration<double>(kill_at));
    ::kill(job.server[1].pid(), SIGKILL);
    CHECK(job.server[1].wait_exit(5s) == 128 + SIGKILL);
    std::this_thread::sleep_for(300ms);
    job.start_server(1, senv);
    MESSAGE("server 1 SIGKILLed " << kill_at << " s into training and restarted");
  }
  int rc[2];
  for (int w = 0; w < 2; ++w) rc[w] = workers[static_cast<std::size_t>(w)].wait_exit(150s);
  res.log = workers[0].output();
  const std::string all = res.log + "--- worker 1\n" + workers[1].output() + job.logs();
  CHECK_MESSAGE(rc[0] == 0, all);
  CHECK_MESSAGE(rc[1] == 0, all);
  res.accuracy = final_accuracy(res.log);
  res.seconds = training_seconds(res.log);
  for (auto& s : job.server) CHECK_MESSAGE(s.wait_exit(15s) == 0, all);
  if (kill_at >= 0) {
    const std::string back = job.server[1].output();
    CHECK_MESSAGE(has(back, "restored"), back);  // it served its snapshot, not an empty shard
    CHECK_MESSAGE(has(all, "is back: re-sent"), all);
  }
  return res;
}
}  // namespace

TEST_CASE("train_mnist survives a server SIGKILLed mid-training and restarted from its checkpoint" *
          doctest::timeout(300)) {
  const auto t0 = clk::now();
  const mnist_run plain = run_mnist(-1);
  MESSAGE("undisturbed: accuracy " << plain.accuracy << ", " << plain.seconds << " s of training, "
                                   << since(t0) << " s in all");
  REQUIRE(plain.accuracy > 0.7);
  const auto t1 = clk::now();
  const mnist_run hit = run_mnist(std::max(0.5, plain.seconds * 0.4));
  MESSAGE("server killed and restarted: accuracy "
          << hit.accuracy << ", " << hit.seconds << " s of training, " << since(t1) << " s in all");
  CHECK(hit.accuracy > 0.7);
  CHECK(std::abs(hit.accuracy - plain.accuracy) <= 0.015);
}

// ---- network namespaces -------------------------------------------------------------------------
namespace {
std::string find_tool(const char* name) {
  for (const char* d : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    std::string p = std::string(d) + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

// Runs a command (no shell); true on exit code 0 within a minute. Output goes to `log` (appended).
bool run_cmd(std::vector<std::string> argv, const std::string& log) {
  try {
    return kvtest::spawn(std::move(argv), kvtest::environment(), log, log,
                         kvtest::open_mode::append)
               .wait_exit(60s) == 0;
  } catch (const std::runtime_error&) {
    return false;
  }
}

// Two namespaces joined by a veth pair: a (10.X.Y.1) and b (10.X.Y.2). Deleted on destruction.
struct netns_pair {
  std::string ip = find_tool("ip"), tc = find_tool("tc"), nft = find_tool("nft");
  std::string a, b, va, vb, addr_a, addr_b, log;
  bool made_a = false, made_b = false, ok = false, netem = false, nft_loss = false;
  std::string why;
  explicit netns_pair(const std::string& logfile) : log(logfile) {
    const std::string id = std::to_string(::getpid() % 100000);
    a = "kvfa" + id;
    b = "kvfb" + id;
    va = "kvfa" + id + "v";
    vb = "kvfb" + id + "v";
    const int n = ::getpid() % 250 + 1;
    addr_a = "10.213." + std::to_string(n) + ".1";
    addr_b = "10.213." + std::to_string(n) + ".2";
    if (::geteuid() != 0) {
      why = "not root";
      return;
    }
    if (ip.empty() || tc.empty()) {
      why = "iproute2 (ip, tc) is not installed";
      return;
    }
    made_a = run_cmd({ip, "netns", "add", a}, log);
    made_b = made_a && run_cmd({ip, "netns", "add", b}, log);
    if (!made_b) {
      why = "cannot create network namespaces (no CAP_NET_ADMIN?)";
      return;
    }
    ok = in(a, {ip, "link", "add", va, "type", "veth", "peer", "name", vb, "netns", b}) &&
         in(a, {ip, "addr", "add", addr_a + "/24", "dev", va}) &&
         in(b, {ip, "addr", "add", addr_b + "/24", "dev", vb}) &&
         in(a, {ip, "link", "set", va, "up"}) && in(b, {ip, "link", "set", vb, "up"}) &&
         in(a, {ip, "link", "set", "lo", "up"}) && in(b, {ip, "link", "set", "lo", "up"});
    if (!ok) why = "cannot make a veth pair between the namespaces";
  }
  ~netns_pair() {
    if (made_a) run_cmd({ip, "netns", "del", a}, log);
    if (made_b) run_cmd({ip, "netns", "del", b}, log);
  }
  bool in(const std::string& ns, std::vector<std::string> cmd) {
    cmd.insert(cmd.begin(), {ip, "netns", "exec", ns});
    return run_cmd(cmd, log);
  }
  // Both directions: 50 ms delay and 5% loss with netem; without netem in the kernel, a rate
  // limit (tbf) that queues and 5% random drops (nftables numgen).
  bool impair() {
    netem =
        in(a, {tc, "qdisc", "add", "dev", va, "root", "netem", "delay", "50ms", "loss", "5%"}) &&
        in(b, {tc, "qdisc", "add", "dev", vb, "root", "netem", "delay", "50ms", "loss", "5%"});
    if (netem) return true;
    if (nft.empty()) {
      why = "the kernel has no netem and nft (nftables) is not installed";
      return false;
    }
    for (auto* ns : {&a, &b}) {
      const std::string dev = ns == &a ? va : vb;
      if (!in(*ns, {tc, "qdisc", "add", "dev", dev, "root", "tbf", "rate", "20mbit", "burst",
                    "16kb", "latency", "50ms"}) ||
          !in(*ns, {nft, "add", "table", "inet", "kvf"}) ||
          !in(*ns, {nft, "add", "chain", "inet", "kvf", "out",
                    "{ type filter hook output priority 0 ; }"}) ||
          !in(*ns, {nft, "add", "rule", "inet", "kvf", "out", "oifname", dev, "numgen", "random",
                    "mod", "100", "<", "5", "counter", "drop"})) {
        why = "cannot impair the link with tc tbf and nft";
        return false;
      }
    }
    nft_loss = true;
    return true;
  }
  // Packets the random-loss rules dropped so far (both ways; nft only).
  long dropped() {
    long n = 0;
    for (auto* ns : {&a, &b}) {
      const std::string out = log + ".nft";
      std::filesystem::remove(out);
      if (!run_cmd({ip, "netns", "exec", *ns, nft, "list", "chain", "inet", "kvf", "out"}, out))
        return -1;
      const std::string text = read_file(out);
      auto at = text.find("counter packets ");
      if (at != std::string::npos) n += std::atol(text.c_str() + at + 16);
    }
    return n;
  }
  // Every packet on the link dropped, both ways.
  bool cut() {
    if (nft_loss)
      return in(a, {nft, "insert", "rule", "inet", "kvf", "out", "oifname", va, "drop"}) &&
             in(b, {nft, "insert", "rule", "inet", "kvf", "out", "oifname", vb, "drop"});
    return in(a, {tc, "qdisc", "change", "dev", va, "root", "netem", "loss", "100%"}) &&
           in(b, {tc, "qdisc", "change", "dev", vb, "root", "netem", "loss", "100%"});
  }
};
}  // namespace

TEST_CASE(
    "a delayed, lossy link between namespaces: exact training; a dead link fails by the deadline "
    "naming the server" *
    doctest::timeout(150)) {
  kvtest::temp_dir dir{"kvstore-faults"};
  netns_pair net(dir / "net.log");
  if (!net.ok) {
    MESSAGE("skipped: " << net.why << "\n" << read_file(net.log));
    return;
  }
  if (!net.impair()) {
    MESSAGE("skipped: " << net.why << "\n" << read_file(net.log));
    return;
  }
  MESSAGE("namespaces "
          << net.a << " (" << net.addr_a << ") and " << net.b << " (" << net.addr_b << "): "
          << std::string(net.netem
                             ? "netem delay 50ms loss 5% each way"
                             : "no netem in this kernel: tbf 20mbit (queueing delay) + nft 5% "
                               "random drops each way"));
  const std::string sched = net.addr_a + ":9191";
  const std::vector<std::string> common = {"KVSTORE_BIND=" + net.addr_a, "KVSTORE_HEARTBEAT_MS=200",
                                           "KVSTORE_DEAD_TIMEOUT_MS=60000"};
  proc scheduler = spawn(
      "scheduler",
      {net.ip, "netns", "exec", net.a, KV_SERVER_PATH, "--role", "scheduler", "--port", "9191"},
      job_env("scheduler", sched, 1, 1, common), dir / "scheduler.log");
  auto senv = common;
  senv.push_back("KVSTORE_RANK=0");
  proc server =
      spawn("server", {net.ip, "netns", "exec", net.a, KV_SERVER_PATH, "--role", "server"},
            job_env("server", sched, 1, 1, senv), dir / "server.log");
  const std::string gate = dir / "cut";
  proc worker = spawn(
      "worker", {net.ip, "netns", "exec", net.b, self_exe, "--fault-child", "net", gate},
      job_env("worker", sched, 1, 1,
              {"KVSTORE_RANK=0", "KVSTORE_HEARTBEAT_MS=200", "KVSTORE_REQUEST_TIMEOUT_MS=8000"}),
      dir / "worker.log");
  const bool trained = wait_until(
      [&] { return has(worker.output(), "trained") || has(worker.output(), "failed"); }, 100s);
  const std::string tlog = worker.output();
  REQUIRE_MESSAGE(trained, (tlog + scheduler.output() + server.output()));
  REQUIRE_MESSAGE(has(tlog, "exactly"), (tlog + scheduler.output() + server.output()));
  if (net.nft_loss) {
    const long lost = net.dropped();
    MESSAGE("packets dropped on the link during training: " << lost);
    CHECK(lost > 0);  // the loss was real and TCP recovered from it
  }
  REQUIRE(net.cut());
  std::ofstream(gate) << "cut\n";
  const int rc = worker.wait_exit(30s);
  const std::string out = worker.output();
  MESSAGE(out);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(has(out, "server 0 (node 8)"));
  CHECK(has(out, "within 8000 ms"));
}

// ---- garbage clients throughout training
// ---------------------------------------------------------
namespace {
// Opens a TCP connection to 127.0.0.1:port (-1 on failure).
int connect_to(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}
void send_all(int fd, const void* p, std::size_t n) {
  (void)::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}
}  // namespace

TEST_CASE("garbage clients connecting throughout training: the values stay exact" *
          doctest::timeout(120)) {
  auto o = kvtest::test_options(2, 2);
  o.handshake_timeout = 1000ms;
  o.max_frame_bytes = std::size_t{64} << 20;
  kvtest::cluster c(o);
  std::atomic<bool> done{false};
  std::atomic<int> started{0};
  long tried[7] = {};
  const char* kinds[7] = {"random bytes",
                          "bad magic",
                          "huge length",
                          "silent (held open)",
                          "connect+close",
                          "half a header (held open)",
                          "frame before the handshake"};
  std::thread attacker([&] {
    while (started < 2 && !done) std::this_thread::sleep_for(1ms);
    const std::vector<std::uint16_t> ports{c.server(0).port(), c.server(1).port(),
                                           c.options().scheduler_port};
    std::mt19937 rng(7);
    std::vector<int> held;
    while (!done) {
      const auto port = ports[rng() % ports.size()];
      const int kind = static_cast<int>(rng() % 7);
      int fd = connect_to(port);
      if (fd < 0) continue;
      ++tried[kind];
      kvstore::wire::header h;
      h.command = kvstore::wire::cmd::push;
      auto b = kvstore::wire::encode(h);
      switch (kind) {
        case 0: {
          std::string junk(1 + rng() % 8192, '\0');
          for (auto& ch : junk) ch = static_cast<char>(rng());
          send_all(fd, junk.data(), junk.size());
          break;
        }
        case 1:
          b[0] ^= std::byte{0x5a};
          send_all(fd, b.data(), b.size());
          break;
        case 2:
          kvstore::wire::detail::put64(b.data() + 16, std::uint64_t{1} << (40 + rng() % 20));
          send_all(fd, b.data(), b.size());
          break;
        case 3:
          break;
        case 4:
          break;
        case 5:
          send_all(fd, b.data(), 10);
          break;
        case 6:
          send_all(fd, b.data(), b.size());
          break;
      }
      if (kind == 3 || kind == 5) {
        held.push_back(fd);
        if (held.size() > 24) {
          ::close(held.front());
          held.erase(held.begin());
        }
      } else {
        ::close(fd);
      }
      std::this_thread::sleep_for(2ms);
    }
    for (int fd : held) ::close(fd);
  });
  kvtest::join_on_exit<bool> join_attacker{attacker, done, true};
  constexpr int rounds = 1500;
  const auto t0 = clk::now();
  c.run_workers([&](KVStore<dist>& kv) {
    const std::size_t n = 300'000;  // sliced over both servers
    kv.init("big", std::vector<float>(n, 0.f));
    kv.init("small", std::vector<float>(100, 0.f));
    kv.init("rows", std::vector<float>(50 * 4, 0.f), 4);
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
    ++started;
    std::vector<float> g(n, static_cast<float>(kv.rank() + 1)), out(n), gs(100, 1.f), outs(100);
    const std::vector<std::int64_t> rows{static_cast<std::int64_t>(kv.rank()), 49};
    std::vector<float> rg(2 * 4, 1.f), rout(2 * 4);
    for (int r = 0; r < rounds; ++r) {
      kv.push("big", g);
      kv.push("small", gs);
      kv.push_rows("rows", rows, rg);
      kv.wait_all();
      kv.pull("big", out);
      kv.pull("small", outs);
      kv.pull_rows("rows", rows, rout);
      kv.wait_all();
      const float k = static_cast<float>(r + 1);
      REQUIRE(out[0] == 3 * k);
      REQUIRE(out[n - 1] == 3 * k);
      REQUIRE(outs[50] == 2 * k);
      REQUIRE(rout[0] == k);      // own row
      REQUIRE(rout[4] == 2 * k);  // row 49: both workers
    }
    REQUIRE(std::all_of(out.begin(), out.end(),
                        [&](float x) { return x == 3.f * static_cast<float>(rounds); }));
  });
  done = true;
  attacker.join();
  long total = 0;
  std::ostringstream os;
  for (int k = 0; k < 7; ++k) {
    total += tried[k];
    os << "  " << kinds[k] << ": " << tried[k] << "\n";
  }
  MESSAGE(total << " bad connections during " << rounds << " exact rounds of 2 workers ("
                << since(t0) << " s):\n"
                << os.str());
  CHECK(total >= 100);
}

int main(int argc, char** argv) {
  self_exe = std::filesystem::read_symlink("/proc/self/exe").string();
  if (argc >= 3 && std::strcmp(argv[1], "--fault-child") == 0) {
    if (std::strcmp(argv[2], "death") == 0) return child_death_worker();
    if (std::strcmp(argv[2], "net") == 0 && argc >= 4) return child_net_worker(argv[3]);
    return 2;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
