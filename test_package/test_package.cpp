// Conan's test_package: the packaged headers compile, link (Boost.Serialization, OpenSSL, Threads)
// and run.
#include <kvstore/kvstore.hpp>

#include <cstdio>
#include <type_traits>
#include <vector>

// KVStore<dist> needs a running cluster, so it is only compiled and linked here (every call below
// is instantiated, pulling in Asio, the wire format and OpenSSL), never run.
static int dist_round(std::vector<float>& w, std::vector<float>& out) {
  kvstore::KVStore<kvstore::dist> kv;
  kv.init(0, w);
  kv.push(0, w).wait();
  kv.pull(0, out).wait();
  return kv.rank();
}
static_assert(!std::is_copy_constructible_v<kvstore::KVStore<kvstore::dist>>);

int main(int argc, char**) {
  kvstore::KVStore<kvstore::local> kv;
  std::vector<float> w{1.0f, 2.0f}, g{0.5f, 0.25f}, out(2);
  kv.init("w", w);
  kv.push("w", g).wait();
  kv.pull("w", out).wait();
  if (out != g) {
    std::fprintf(stderr, "test_package: pulled %g %g, expected 0.5 0.25\n", out[0], out[1]);
    return 1;
  }
  if (argc > 1000) return dist_round(w, out);  // never: keeps the dist code in the link
  std::puts("kvstore test_package: KVStore<local> ok, KVStore<dist> linked");
  return 0;
}
