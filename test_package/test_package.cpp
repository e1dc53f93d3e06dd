// Conan's test_package: the packaged headers compile, link (Boost.Serialization, Threads) and run.
#include <kvstore/kvstore.hpp>

#include <cstdio>
#include <type_traits>
#include <vector>

#if __has_include(<kvstore/dist.hpp>)
#include <kvstore/dist.hpp>
// The distributed store's headers compile here too (constructing one would need a cluster).
static_assert(!std::is_copy_constructible_v<kvstore::KVStore<kvstore::dist>>);
static_assert(std::is_move_constructible_v<kvstore::KVStore<kvstore::dist>>);
#endif

int main() {
  kvstore::KVStore<kvstore::local> kv;
  std::vector<float> w{1.0f, 2.0f}, g{0.5f, 0.25f}, out(2);
  kv.init("w", w);
  kv.push("w", g).wait();
  kv.pull("w", out).wait();
  if (out != g) {
    std::fprintf(stderr, "test_package: pulled %g %g, expected 0.5 0.25\n", out[0], out[1]);
    return 1;
  }
  std::puts("kvstore test_package: KVStore<local> ok");
  return 0;
}
