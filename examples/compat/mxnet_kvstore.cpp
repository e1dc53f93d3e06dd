// mxnet_kvstore: MXNet's KVStore tutorial (python/kvstore) as C++ over kvstore's MXNet layer, each
// step beside the Python it replaces, with the values the tutorial prints checked. The store is
// made by name, as mx.kv.create's is:
//
//   build/examples/mxnet_kvstore                  # local
//   build/examples/kv_launch -w 2 -s 1 -- build/examples/mxnet_kvstore dist_sync
//
// With W workers in dist_sync every push of a round is summed over the workers, so the values the
// tutorial prints for one process are W times larger (the program checks that).
#include <kvstore/compat/mxnet.hpp>

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace mx = kvstore::compat::mxnet;

namespace {

int failures = 0;

// Prints the array as the tutorial does and checks it holds `want` everywhere.
void expect(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  std::printf("%-34s [", what);
  for (std::size_t i = 0; i < got.size(); ++i) std::printf("%s%g", i ? " " : "", got[i]);
  std::printf("]\n");
  if (got != want) {
    std::printf("  ^ expected [");
    for (std::size_t i = 0; i < want.size(); ++i) std::printf("%s%g", i ? " " : "", want[i]);
    std::printf("]\n");
    ++failures;
  }
}

std::vector<float> full(float v) { return std::vector<float>(6, v); }  // shape (2, 3)

}  // namespace

int main(int argc, char** argv) {
  const std::string type = argc > 1 ? argv[1] : "local";
  auto kv = mx::KVStore::create(type);  // kv = mx.kv.create('local')
  const auto w = static_cast<float>(kv.num_workers());
  std::printf("mxnet_kvstore: %s store, rank %d of %d\n", kv.type().c_str(), kv.rank(),
              kv.num_workers());

  // kv.init(3, mx.nd.ones(shape)*2); a = mx.nd.zeros(shape); kv.pull(3, out=a)
  std::vector<float> a(6, 0.0f);
  kv.init(3, full(2));
  kv.pull(3, a).wait();
  expect("init 2, pull:", a, full(2));

  // kv.push(3, mx.nd.ones(shape)*8); kv.pull(3, out=a)
  const auto eights = full(8);  // alive until the push is done, as NDArrays are
  kv.push(3, eights);
  kv.pull(3, a).wait();
  expect("push 8, pull:", a, full(8 * w));

  // b = [mx.nd.ones(shape, gpu) for gpu in gpus]; kv.push(3, b); kv.pull(3, out=a)
  const auto ones = full(1);
  kv.push(3, {ones, ones, ones, ones});  // four devices' values, summed first
  kv.pull(3, a).wait();
  expect("push 4 devices' ones, pull:", a, full(4 * w));

  // b = [mx.nd.zeros(shape, gpu) for gpu in gpus]; kv.pull(3, out=b)
  std::vector<float> b0(6), b1(6);
  kv.pull(3, {b0, b1}).wait();
  expect("pull to 2 devices, b[1]:", b1, full(4 * w));

  // keys = [5, 7, 9]; kv.init(keys, [mx.nd.ones(shape)]*len(keys))
  // kv.push(keys, [mx.nd.ones(shape)*3]*len(keys)); kv.pull(keys, out=b)
  const std::vector<kvstore::key> keys{5, 7, 9};
  const auto threes = full(3);
  const std::vector<std::span<const float>> init_vals(3, ones), push_vals(3, threes);
  std::vector<float> o5(6), o7(6), o9(6);
  const std::vector<std::span<float>> outs{o5, o7, o9};
  kv.init(keys, init_vals);
  kv.push(keys, push_vals);
  kv.pull(keys, outs).wait();
  expect("keys 5, 7, 9: push 3, pull key 9:", o9, full(3 * w));

  // An embedding of 4 rows of 3, row r holding r+1:
  // kv.init('embed', weight.tostype('row_sparse'))
  // kv.row_sparse_pull('embed', out=e, row_ids=mx.nd.array([3, 1, 3]))
  std::vector<float> embed(12), e(12, -1.0f);
  for (std::size_t i = 0; i < embed.size(); ++i) embed[i] = static_cast<float>(i / 3 + 1);
  kv.init("embed", embed, /*row_length=*/3);
  const std::vector<std::int64_t> row_ids{3, 1, 3};
  kv.row_sparse_pull("embed", e, row_ids).wait();
  expect("row_sparse_pull rows 3, 1, 3:", e, {0, 0, 0, 2, 2, 2, 0, 0, 0, 4, 4, 4});

  // kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1)) -- from rank 0, as MXNet's scripts do
  if (kv.rank() == 0) kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.1});
  kv.barrier();  // every worker's next push is a gradient
  // kv.push(3, mx.nd.ones(shape)); kv.pull(3, out=a): w -= 0.1 * (sum of the workers' ones)
  kv.push(3, ones);
  kv.pull(3, a).wait();
  expect("sgd(0.1) after a push of ones:", a, full(4 * w - 0.1f * w));

  kv.dispose();
  if (failures) {
    std::printf("mxnet_kvstore: %d value(s) differ from MXNet's\n", failures);
    return 1;
  }
  std::printf("mxnet_kvstore: every value as MXNet's tutorial prints it\n");
  return 0;
}
