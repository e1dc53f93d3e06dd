// placement_smoke: a worker of a colocated job (`kv_launch -w W --colocated -- placement_smoke`,
// or `mpirun -np W -x KVSTORE_COLOCATED=1 placement_smoke`). Each worker checks that it serves a
// shard (as many servers as workers), that partition::even gives BigDL's chunks, then runs sync
// rounds the way BigDL's AllReduceParameter does (every worker pushes every chunk of its gradient,
// then pulls its own chunk and the whole key) and checks every value exactly. Exit codes: 0 all
// right, 1 a wrong value, 2 a kvstore error, 3 an error while holding (--hold), 4 holding lasted
// 60 s without an error.
//   --hold  after the checks print this process's pid and pull until an error (a killed worker's
//           server) ends it
#include <kvstore/kvstore.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

int wrong(int rank, const std::string& what, double got, double want) {
  std::printf("placement_smoke rank %d: wrong value: %s is %g, expected %g\n", rank, what.c_str(),
              got, want);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool hold = argc == 2 && std::string(argv[1]) == "--hold";
  if (argc > 1 && !hold) {
    std::fprintf(stderr, "usage: placement_smoke [--hold]\n");
    return 2;
  }
  int rank = -1;
  try {
    kvstore::KVStore<kvstore::dist> kv;  // from the environment
    rank = kv.rank();
    const int w = kv.num_workers(), s = kv.num_servers();
    std::printf("placement_smoke rank %d of %d workers, %d servers, %s%s\n", rank, w, s,
                kv.type().c_str(), kv.colocated() ? ", colocated" : "");
    std::fflush(stdout);
    if (!kv.colocated() || s != w) return wrong(rank, "server count (colocated)", s, w);

    // BigDL's chunks: start i*floor(n/S) + min(i, n mod S), length floor(n/S) + (i < n mod S).
    const std::size_t n = 10 + 7 * static_cast<std::size_t>(w);
    kv.init("p", std::vector<float>(n, 1.0f),
            kvstore::init_options{.partition = kvstore::partition::even});
    for (int i = 0; i < s; ++i) {
      const std::size_t base = n / s, extra = n % s, ui = static_cast<std::size_t>(i);
      auto [start, len] = kv.slice_of("p", i);
      if (start != ui * base + std::min(ui, extra))
        return wrong(rank, "start of chunk " + std::to_string(i), start,
                     ui * base + std::min(ui, extra));
      if (len != base + (ui < extra ? 1 : 0))
        return wrong(rank, "length of chunk " + std::to_string(i), len, base + (ui < extra));
    }

    // Rounds: every worker pushes (rank + 1) * round on every chunk; the sum is stored.
    auto [mine, len] = kv.slice_of("p", rank);
    std::vector<float> g(n), part(len), all(n);
    for (int round = 1; round <= 3; ++round) {
      std::fill(g.begin(), g.end(), static_cast<float>((rank + 1) * round));
      for (int i = 0; i < s; ++i) {
        auto [start, l] = kv.slice_of("p", i);
        kv.push_range("p", start, std::span<const float>(g).subspan(start, l));
      }
      kv.pull_range("p", mine, part).wait();
      const double want = round * w * (w + 1) / 2.0;
      for (float x : part)
        if (x != want) return wrong(rank, "own chunk in round " + std::to_string(round), x, want);
      kv.pull("p", all).wait();
      for (float x : all)
        if (x != want) return wrong(rank, "key in round " + std::to_string(round), x, want);
    }
    kv.barrier();
    std::printf("placement_smoke rank %d ok\n", rank);
    std::fflush(stdout);

    if (hold) {
      kv.set_barrier_before_exit(false);
      std::printf("placement_smoke rank %d pid %d holding\n", rank, static_cast<int>(::getpid()));
      std::fflush(stdout);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      try {
        while (std::chrono::steady_clock::now() < until) {
          kv.pull("p", all).wait();
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      } catch (const std::exception& e) {
        std::printf("placement_smoke rank %d: error while holding: %s\n", rank, e.what());
        std::fflush(stdout);
        return 3;
      }
      std::printf("placement_smoke rank %d: held 60 s without an error\n", rank);
      return 4;
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("placement_smoke rank %d: error: %s\n", rank, e.what());
    std::fflush(stdout);
    return 2;
  }
}
