// dist_smoke: a small worker program for `kv_launch -w W -s S -- dist_smoke [--wrong] [--hold]`.
// Each worker inits keys, runs sync rounds of push/pull, rows, a command to the servers and a
// barrier, and checks every value exactly. Launched SPMD (mpirun, srun, torchrun), its servers
// run the command handler registered below; under kv_launch, kv_server's. Exit codes: 0 all values
// right, 1 a wrong value, 2 a kvstore error, 3 an error while holding (--hold), 4 holding lasted 60
// s without an error.
//   --wrong  expect a wrong sum on purpose (to prove a wrong value fails the job)
//   --hold   after the checks keep pushing and pulling until an error (a killed server) ends it
#include <kvstore/kvstore.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

int fail_value(int rank, const std::string& what, double got, double want) {
  std::printf("dist_smoke rank %d: wrong value: %s is %g, expected %g\n", rank, what.c_str(), got,
              want);
  return 1;
}

}  // namespace

// Accepts every command: without it an SPMD server would answer send_command_to_servers with
// errc::unsupported, and the run below would fail.
KVSTORE_REGISTER_COMMAND_HANDLER([](int, std::string_view) {});

int main(int argc, char** argv) {
  bool wrong = false, hold = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--wrong")
      wrong = true;
    else if (a == "--hold")
      hold = true;
    else {
      std::fprintf(stderr, "usage: dist_smoke [--wrong] [--hold]\n");
      return 2;
    }
  }
  int rank = -1;
  try {
    kvstore::KVStore<kvstore::dist> kv;  // from the environment kv_launch sets
    rank = kv.rank();
    const int w = kv.num_workers();
    std::printf("dist_smoke rank %d of %d workers, %s\n", rank, w, kv.type().c_str());
    std::fflush(stdout);
    const float r = static_cast<float>(rank);

    // init: rank 0's value wins.
    const std::size_t n = 1000;
    kv.init(1, std::vector<float>(n, 10.0f + r));
    kv.init("emb", std::vector<float>(12, 0.0f), 3);  // 4 rows of 3
    std::vector<float> out(n);
    kv.pull(1, out).wait();
    for (float x : out)
      if (x != 10.0f) return fail_value(rank, "key 1 after init", x, 10.0);

    // Sync rounds: every worker pushes (rank + 1) * round; the sum is round * w (w + 1) / 2.
    for (int round = 1; round <= 5; ++round) {
      std::vector<float> g(n, (r + 1) * static_cast<float>(round));
      kv.push(1, g, round).wait();
      kv.pull(1, out).wait();
      double want = round * w * (w + 1) / 2.0 + (wrong ? 1 : 0);
      for (float x : out)
        if (x != want) return fail_value(rank, "key 1 in round " + std::to_string(round), x, want);
    }

    // Rows: each worker pushes row (rank % 4) with ones; then every row holds its count.
    std::vector<std::int64_t> mine{rank % 4};
    kv.push_rows("emb", mine, std::vector<float>(3, 1.0f)).wait();
    std::vector<std::int64_t> all{0, 1, 2, 3};
    std::vector<float> rows(12);
    kv.pull_rows("emb", all, rows).wait();
    for (int row = 0; row < 4; ++row) {
      int count = 0;
      for (int k = 0; k < w; ++k) count += (k % 4 == row);
      for (int j = 0; j < 3; ++j)
        if (rows[static_cast<std::size_t>(row * 3 + j)] != static_cast<float>(count))
          return fail_value(rank, "row " + std::to_string(row),
                            rows[static_cast<std::size_t>(row * 3 + j)], count);
    }
    kv.send_command_to_servers(1, "dist_smoke rank " + std::to_string(rank));
    kv.barrier();
    std::printf("dist_smoke rank %d ok\n", rank);
    std::fflush(stdout);

    if (hold) {
      // A key above the default slice bound (1 MiB): sliced over every server, so losing any
      // server fails its next push or pull.
      const std::size_t big = 300000;
      kv.init("big", std::vector<float>(big, 0.0f));
      std::vector<float> g(big, 1.0f), got(big);
      std::printf("dist_smoke rank %d holding\n", rank);
      std::fflush(stdout);
      kv.set_barrier_before_exit(false);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      try {
        while (std::chrono::steady_clock::now() < until) {
          kv.push("big", g).wait();
          kv.pull("big", got).wait();
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      } catch (const std::exception& e) {
        std::printf("dist_smoke rank %d: error while holding: %s\n", rank, e.what());
        std::fflush(stdout);
        return 3;
      }
      std::printf("dist_smoke rank %d: held 60 s without an error\n", rank);
      return 4;
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("dist_smoke rank %d: error: %s\n", rank, e.what());
    std::fflush(stdout);
    return 2;
  }
}
