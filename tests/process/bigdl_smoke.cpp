// bigdl_smoke: a node of a colocated job (`kv_launch -w W --colocated -- bigdl_smoke`) running
// BigDL's AllReduceParameter (compat/bigdl.hpp) with exact checks: one parameter per compression,
// every node puts 0.1f, aggregate_gradient_partition(W) gives 0.099609375 (fp16), 0.10009765625
// (bf16), 0.1 (none); the weight partition keeps 0.1f while get_weights gives the compressed
// value; then two iterations with small integers (exact on the wire) route every chunk to its
// owner and back. Prints "bigdl_smoke rank R ok". Exit codes: 0 all right, 1 a wrong value, 2 a
// kvstore error (printed as "bigdl_smoke rank R: error: ...").
#include <kvstore/compat/bigdl.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

namespace bigdl = kvstore::compat::bigdl;

struct wrong_value : std::exception {};

int rank_of_process = -1;

void expect(bool ok, const std::string& what, double got, double want) {
  if (ok) return;
  std::printf("bigdl_smoke rank %d: wrong value: %s is %.12g, expected %.12g\n", rank_of_process,
              what.c_str(), got, want);
  throw wrong_value{};
}

void one_iteration(kvstore::KVStore<kvstore::dist>& kv, std::int64_t id, bigdl::compress c,
                   float want) {
  const int w = kv.num_workers();
  const std::size_t n = 10 + 3 * static_cast<std::size_t>(w);
  const std::string name = "parameter " + std::to_string(id);
  bigdl::AllReduceParameter<float> p(kv, id, w, n, c);
  const auto info = p.init(std::vector<float>(n, 0.1f));
  const auto chunk = bigdl::chunk_of(kv.rank(), w, n);
  expect(info == chunk, name + " partition start", static_cast<double>(info.start),
         static_cast<double>(chunk.start));
  std::vector<float> local(n);
  p.get_weights(local).wait();
  for (float x : local) expect(x == want, name + " local copy after init", x, want);
  p.put_gradients(std::vector<float>(n, 0.1f));
  p.aggregate_gradient_partition(w);
  for (float g : p.gradient_partition()) expect(g == want, name + " gradient partition", g, want);
  p.send_weight_partition();  // unchanged: the master is 0.1f, the copies `want`
  p.get_weights(local).wait();
  for (float x : p.weight_partition()) expect(x == 0.1f, name + " weight partition", x, 0.1f);
  for (float x : local) expect(x == want, name + " local copy", x, want);
}

void routing(kvstore::KVStore<kvstore::dist>& kv) {
  const int w = kv.num_workers(), r = kv.rank();
  const std::size_t n = 7 * static_cast<std::size_t>(w) + 2;
  bigdl::AllReduceParameter<float> p(kv, 100, w, n);  // fp16: small integers travel exactly
  std::vector<float> local(n);
  for (std::size_t j = 0; j < n; ++j) local[j] = static_cast<float>(j);
  const auto info = p.init(local);
  const float sum = static_cast<float>(w * (w + 1) / 2);  // node r puts r + 1
  for (int it = 1; it <= 2; ++it) {
    p.put_gradients(std::vector<float>(n, static_cast<float>(r + 1)));
    p.aggregate_gradient_partition(1);
    for (float g : p.gradient_partition()) expect(g == sum, "routing: gradient", g, sum);
    for (std::size_t i = 0; i < info.length; ++i) p.weight_partition()[i] -= sum;
    p.send_weight_partition();
    p.get_weights(local).wait();
    for (std::size_t j = 0; j < n; ++j) {
      const float want = static_cast<float>(j) - sum * static_cast<float>(it);
      expect(local[j] == want, "routing: element " + std::to_string(j), local[j], want);
    }
  }
}

}  // namespace

int main() {
  try {
    kvstore::KVStore<kvstore::dist> kv;  // from the environment
    rank_of_process = kv.rank();
    std::printf("bigdl_smoke rank %d of %d workers, %d servers, %s%s\n", kv.rank(),
                kv.num_workers(), kv.num_servers(), kv.type().c_str(),
                kv.colocated() ? ", colocated" : "");
    std::fflush(stdout);
    one_iteration(kv, 1, bigdl::compress::fp16, 0.099609375f);
    one_iteration(kv, 2, bigdl::compress::bf16, 0.10009765625f);
    one_iteration(kv, 3, bigdl::compress::none, 0.1f);
    routing(kv);
    kv.barrier();
    std::printf("bigdl_smoke rank %d ok\n", rank_of_process);
    return 0;
  } catch (const wrong_value&) {
    return 1;
  } catch (const std::exception& e) {
    std::printf("bigdl_smoke rank %d: error: %s\n", rank_of_process, e.what());
    return 2;
  }
}
