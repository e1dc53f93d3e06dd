// hello_dist: the smallest complete KVStore<dist> worker. Every worker pushes its rank + 1 for
// three rounds; in dist_sync a server sums each round over all workers and applies the
// optimizer (SGD with learning rate -1 adds the sum), so every pull sees the same exact value.
//
//   build/examples/kv_launch -w 2 -s 1 -- build/examples/hello_dist
#include <kvstore/kvstore.hpp>

#include <cstdio>
#include <vector>

int main() {
  kvstore::KVStore<kvstore::dist> kv;  // role, rank and scheduler from the environment (kv_launch)
  const int n = kv.num_workers();
  std::vector<float> w(1000, 0.0f), g(w.size(), static_cast<float>(kv.rank() + 1));

  kv.init("w", w);  // rank 0's value is stored; every worker returns once it is
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
  for (int round = 1; round <= 3; ++round) {
    kv.push("w", g);         // summed over all workers in this round
    kv.pull("w", w).wait();  // sees the weights after this round
    const float want = static_cast<float>(round * n * (n + 1) / 2);
    if (w.front() != want || w.back() != want) {
      std::printf("hello_dist rank %d: round %d gave %g, expected %g\n", kv.rank(), round,
                  w.front(), want);
      return 1;
    }
  }
  kv.barrier();
  std::printf("hello_dist rank %d of %d: %g after 3 rounds\n", kv.rank(), n, w.front());
  return 0;
}
