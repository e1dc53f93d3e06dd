// Checkpoints and restart: a server process killed with SIGKILL mid-training and started again
// with the same rank restores its snapshot; the worker waits for it, re-sends what was in flight,
// and training goes on with every push applied exactly once, and every key's version (rounds or
// pushes) counted once. A corrupt snapshot is refused.
#include <kvstore/server/checkpoint.hpp>  // first: the header is self-contained
// The server and scheduler classes themselves (kvstore.hpp declares only kvstore::node_loop).
#include <kvstore/rendezvous/scheduler.hpp>

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/process.hpp"

#include <signal.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#ifndef KV_SERVER_PATH
#error "KV_SERVER_PATH must name the kv_server binary"
#endif

using namespace std::chrono_literals;

namespace {

// Starts kv_server --role server with the job's environment (stderr into `stderr_file` if given).
kvtest::child spawn_server(std::uint16_t sched_port, const std::filesystem::path& dir, int rank,
                           const std::string& stderr_file = {},
                           std::vector<std::string> extra_env = {}) {
  std::vector<std::string> env = {
      "KVSTORE_ROLE=server",
      "KVSTORE_SCHEDULER=127.0.0.1:" + std::to_string(sched_port),
      "KVSTORE_NUM_WORKERS=1",
      "KVSTORE_NUM_SERVERS=1",
      "KVSTORE_RANK=" + std::to_string(rank),
      "KVSTORE_CHECKPOINT_DIR=" + dir.string(),
      "KVSTORE_CHECKPOINT_ROUNDS=1",
      "PATH=/usr/bin:/bin",
  };
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  return kvtest::spawn({KV_SERVER_PATH, "--role", "server"}, std::move(env), {}, stderr_file);
}

// SIGKILLs the server (running or stopped) and, after a moment, starts it again with rank 0
// and the same extra environment.
void kill_and_restart(kvtest::child& server, std::uint16_t sched_port,
                      const std::filesystem::path& dir, std::vector<std::string> extra_env = {}) {
  server.kill();
  std::this_thread::sleep_for(200ms);
  server = spawn_server(sched_port, dir, 0, {}, std::move(extra_env));
}

// A 1 x 1 job whose server is killed and restarted: the worker holds and re-sends its requests,
// and the restart, not the heartbeat deadline, decides.
kvstore::dist_options restart_options(bool sync) {
  auto o = kvtest::test_options(1, 1, sync);
  o.server_restart_wait = 30'000ms;
  o.request_timeout = 40'000ms;
  o.dead_timeout = 60'000ms;
  return o;
}

// A 1 x 1 job (scheduler in this process, server a kv_server process) whose server is killed
// and restarted once the worker's count of rounds reaches `kill_at`, whatever is in flight.
struct restarted_job {
  kvtest::temp_dir dir;
  kvstore::dist_options o;
  kvstore::scheduler sched;
  std::thread st;
  kvtest::child server;
  std::atomic<int> round{0};
  std::atomic<bool> restarted{false};
  std::thread killer;

  restarted_job(const char* name, bool sync, int kill_at)
      : dir{name}, o(restart_options(sync)), sched(o) {
    o.scheduler_port = sched.port();
    o.rank_hint = 0;  // the worker's
    st = std::thread([this] { sched.run(); });
    server = spawn_server(o.scheduler_port, dir.path(), 0);
    killer = std::thread([this, kill_at] {
      while (round < kill_at) std::this_thread::sleep_for(1ms);
      if (round > kill_at + 1'000'000) return;  // released: the worker failed early
      kill_and_restart(server, o.scheduler_port, dir.path());
      restarted = true;
    });
  }
  /// After the worker's store is gone: the restarted server's exit code (it ends with the job).
  int finish() {
    round = 1 << 30;
    if (killer.joinable()) killer.join();
    const int code = server.wait_exit(15'000ms);
    sched.stop();
    st.join();
    return code;
  }
  ~restarted_job() {
    if (st.joinable()) finish();
  }
};

}  // namespace

TEST_CASE("a server killed mid-training restarts from its snapshot; nothing is lost or doubled" *
          doctest::timeout(120)) {
  restarted_job job("kvstore-restart", /*sync=*/true, /*kill_at=*/40);
  constexpr int rounds = 120;
  {
    kvstore::KVStore<kvstore::dist> kv(job.o);
    std::vector<float> v(5000, 0.f), g(5000, 1.f), out(5000);
    kv.init("weights", v);
    std::vector<std::int64_t> rows{1, 3};
    std::vector<float> m(40, 0.f), rg(2 * 8, 1.f), rout(2 * 8);
    kv.init("rows", m, 8);
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});  // w += g: counts pushes
    for (int r = 0; r < rounds; ++r) {
      kv.push("weights", g, r % 3).wait();
      kv.push_rows("rows", rows, rg).wait();
      job.round = r + 1;
    }
    kv.pull("weights", out).wait();
    kv.pull_rows("rows", rows, rout).wait();
    CHECK(job.restarted.load());
    for (float x : out) REQUIRE(x == static_cast<float>(rounds));  // exactly once each
    for (float x : rout) REQUIRE(x == static_cast<float>(rounds));
    // The versions (rounds completed) came through the restart, each round counted once.
    CHECK(kv.version("weights") == rounds);
    CHECK(kv.version("rows") == rounds);
  }
  CHECK(job.finish() == 0);  // the restarted server ends with the job
  CHECK(std::filesystem::exists(kvstore::detail::snapshot_path(job.dir.path(), 0)));
}

TEST_CASE(
    "dist_async: a push half applied when its server dies is applied exactly once after the "
    "restart" *
    doctest::timeout(120)) {
  // Each round pushes 4 MiB in 16 KiB frames and, at a higher priority, a small key that
  // overtakes it on the wire. The small push completes while the big one is half applied, and
  // the snapshot it asks for (one per push) holds the big key half applied. The server is
  // killed right after such a snapshot reached the disk (found by pausing it with SIGSTOP and
  // reading the file), before the big push completes: the restored server has half of that push,
  // the worker re-sends all of it, and only the other half may be applied.
  kvtest::temp_dir dir{"kvstore-restart"};
  auto o = restart_options(/*sync=*/false);
  o.chunk_bytes = 16 << 10;
  kvstore::scheduler sched(o);
  o.scheduler_port = sched.port();
  std::thread st([&] { sched.run(); });

  constexpr int rounds = 40;
  const std::size_t n = std::size_t{1} << 20;  // 4 MiB of float: 256 frames
  const std::vector<std::string> env{"KVSTORE_TYPE=dist_async"};
  kvtest::child server = spawn_server(o.scheduler_port, dir.path(), 0, {}, env);
  std::atomic<int> round{0};
  std::atomic<bool> restarted{false}, caught_mid_push{false};
  std::thread killer([&] {
    while (round < 5) std::this_thread::sleep_for(1ms);
    const auto path = kvstore::detail::snapshot_path(dir.path(), 0);
    const std::uint64_t big = kvstore::key("big").id();
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!caught_mid_push && round < rounds - 5 && std::chrono::steady_clock::now() < until) {
      server.signal(SIGSTOP);
      try {
        for (auto& x : kvstore::detail::load_snapshot(path).slices) {
          if (x.key != big || x.value.size() != n * sizeof(float)) continue;
          float head = 0, tail = 0;
          std::memcpy(&head, x.value.data(), sizeof head);
          std::memcpy(&tail, x.value.data() + x.value.size() - sizeof tail, sizeof tail);
          caught_mid_push = head != tail;  // frames 1.. of a push applied, the last ones not
        }
      } catch (const kvstore::error&) {
      }
      if (caught_mid_push) break;
      server.signal(SIGCONT);
      std::this_thread::sleep_for(1ms);
    }
    kill_and_restart(server, o.scheduler_port, dir.path(), env);
    restarted = true;
  });

  kvtest::join_on_exit<int> join_killer{killer, round, 1 << 20};
  {
    auto w = o;
    w.rank_hint = 0;
    kvstore::KVStore<kvstore::dist> kv(w);
    std::vector<float> bigv(n, 0.f), small(16, 0.f);
    kv.init("big", bigv);
    kv.init("small", small);
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});  // w += g: counts pushes
    const std::vector<float> g(n, 1.f), gs(16, 1.f);
    for (int r = 0; r < rounds; ++r) {
      auto a = kv.push("big", g, 0);
      auto b = kv.push("small", gs, 1);
      b.wait();
      a.wait();
      round = r + 1;
    }
    std::vector<float> out(n), outs(16);
    kv.pull("big", out).wait();
    kv.pull("small", outs).wait();
    CHECK(restarted.load());
    if (!caught_mid_push) WARN("no snapshot with a half-applied push was seen before the kill");
    std::size_t wrong = 0, first_wrong = n;
    for (std::size_t i = 0; i < n; ++i)
      if (out[i] != static_cast<float>(rounds)) {
        if (!wrong++) first_wrong = i;
      }
    CHECK_MESSAGE(wrong == 0, wrong, " of ", n, " elements of the big key are not ", rounds,
                  " (the first at ", first_wrong, ": ", first_wrong < n ? out[first_wrong] : 0.f,
                  "; last: ", out[n - 1], ")");
    for (float x : outs) REQUIRE(x == static_cast<float>(rounds));
    // The versions (pushes applied) came through the restart, the half-applied push once.
    CHECK(kv.version("big") == rounds);
    CHECK(kv.version("small") == rounds);
  }
  if (killer.joinable()) killer.join();
  CHECK(server.wait_exit(15'000ms) == 0);
  sched.stop();
  st.join();
}

TEST_CASE(
    "a server restarted from its snapshot resumes the learning-rate schedule at the same step" *
    doctest::timeout(120)) {
  restarted_job job("kvstore-restart-schedule", /*sync=*/true, /*kill_at=*/60);
  {
    kvstore::KVStore<kvstore::dist> kv(job.o);
    std::vector<float> v(1000, 0.f), g(1000, -1.f), out(1000);
    kv.init("w", v);
    // w += lr_t: MXNet's FactorScheduler(step=40, factor=0.5) on base 1 gives 40 updates at 1,
    // 40 at 0.5, 40 at 0.25; the kill falls in the second stage. A step count restarting from 0
    // would give more.
    kv.set_optimizer(kvstore::optim::sgd{
        .learning_rate = 1.0,
        .schedule = kvstore::optim::factor_schedule{.step = 40, .factor = 0.5}});
    for (int r = 0; r < 120; ++r) {
      kv.push("w", g).wait();
      job.round = r + 1;
    }
    kv.pull("w", out).wait();
    CHECK(job.restarted.load());
    for (float x : out) REQUIRE(x == 40.f + 20.f + 10.f);
  }
  CHECK(job.finish() == 0);
}

TEST_CASE("a server the scheduler refuses before it joins exits non-zero, saying why" *
          doctest::timeout(60)) {
  kvtest::temp_dir dir{"kvstore-refused-server"};
  auto o = restart_options(/*sync=*/true);
  o.token = "the-right-token";
  o.bind_host = "127.0.0.1";
  kvstore::scheduler sched(o);
  o.scheduler_port = sched.port();
  std::thread st([&] {
    try {
      sched.run();
    } catch (const kvstore::error&) {  // the job never gathers: its deadline, after the check
    }
  });
  const std::string err = dir / "server.err";
  kvtest::child server =
      spawn_server(o.scheduler_port, dir.path(), 0, err, {"KVSTORE_TOKEN=a-wrong-token"});
  const int code = server.wait_exit(20'000ms);
  sched.stop();
  st.join();
  const std::string said = kvtest::read_file(err);
  INFO("stderr:\n" << said);
  CHECK(code != 0);  // it used to serve on and exit 0 once no worker was left
  CHECK(said.find("before this server joined the job") != std::string::npos);
  CHECK(said.find("token") != std::string::npos);
}

TEST_CASE("a corrupt or truncated snapshot is refused with a clear error" * doctest::timeout(60)) {
  kvtest::temp_dir dir{"kvstore-restart"};
  kvstore::detail::shard_snapshot snap;
  snap.rank = 0;
  kvstore::detail::slice_snapshot x;
  x.key = 1;
  x.total = 4;
  x.hi = 4;
  x.value = std::string(16, '\1');
  snap.slices.push_back(x);
  const auto path = kvstore::detail::snapshot_path(dir.path(), 0);
  kvstore::detail::save_snapshot(path, snap);
  auto good = kvstore::detail::load_snapshot(path);
  REQUIRE(good.slices.size() == 1);
  CHECK(good.slices[0].value == x.value);

  const std::string bytes = kvtest::read_file(path);
  for (std::size_t cut : {std::size_t{0}, std::size_t{7}, std::size_t{20}, bytes.size() - 1}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(cut));
    CHECK_THROWS_WITH_AS(kvstore::detail::load_snapshot(path), doctest::Contains("server snapshot"),
                         kvstore::error);
  }
  auto flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x20;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(flipped.data(), static_cast<std::streamsize>(flipped.size()));
  CHECK_THROWS_WITH_AS(kvstore::detail::load_snapshot(path), doctest::Contains("checksum"),
                       kvstore::error);

  // A real server refuses to start from it, saying why, instead of serving half a model.
  auto o = kvtest::test_options(1, 1);
  kvstore::scheduler sched(o);
  const std::string log = dir / "server.err";
  kvtest::child server = spawn_server(sched.port(), dir.path(), 0, log);
  CHECK(server.wait_exit(20'000ms) == 1);
  CHECK(kvtest::read_file(log).find("checksum") != std::string::npos);
}
