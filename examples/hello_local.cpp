// hello_local: the smallest complete KVStore<local> program. Two "devices" push their gradients
// of one key; the store sums them, applies SGD to the stored weights, and a pull reads them back.
//
//   build/examples/hello_local
#include <kvstore/local.hpp>  // KVStore<local> alone; <kvstore/kvstore.hpp> has every store

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  kvstore::KVStore<kvstore::local> kv;  // one process, values of float
  std::vector<float> w(4, 1.0f), g0(4, 0.5f), g1(4, 0.25f), out(4);

  kv.init("fc1.w", w);  // once per key; blocks until stored
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.1});
  kv.push("fc1.w", {g0, g1});    // two devices' gradients: summed, then w -= 0.1 * 0.75
  kv.pull("fc1.w", out).wait();  // push and pull return at once; wait() before reading `out`

  for (float x : out)
    if (std::abs(x - 0.925f) > 1e-6f) {
      std::printf("hello_local: got %g, expected 0.925\n", x);
      return 1;
    }
  std::printf("hello_local: fc1.w = %g after one step\n", out[0]);
  return 0;
}
