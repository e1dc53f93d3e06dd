// A consumer's program: built against kvstore the way a user would take it (find_package of an
// installed copy, or add_subdirectory of the source tree). Exit 0 only if the store works.
#include <kvstore/kvstore.hpp>

#include <cstdio>
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

int main(int argc, char**) {
  kvstore::KVStore<kvstore::local> kv;
  std::vector<float> w{1.0f, 2.0f, 3.0f}, g0{0.5f, 0.5f, 0.5f}, g1{0.25f, 1.0f, 2.0f}, out(3);

  kv.init(7, w);
  kv.push(7, {g0, g1}).wait();  // no optimizer: the store holds the sum of the pushed values
  kv.pull(7, out).wait();

  const std::vector<float> expected{0.75f, 1.5f, 2.5f};
  if (out != expected) {
    std::fprintf(stderr, "consumer: pulled %g %g %g, expected 0.75 1.5 2.5\n", out[0], out[1],
                 out[2]);
    return 1;
  }
  if (argc > 1000) return dist_round(w, out);  // never: keeps the dist code in the link
  std::puts("consumer: KVStore<local> init/push/pull ok, KVStore<dist> linked");
  return 0;
}
