// bigdl_mnist: BigDL's DistriOptimizer recipe training the Fashion-MNIST MLP over kvstore's
// AllReduceParameter (compat/bigdl.hpp). Every node (a worker process that also serves one
// partition: colocated) holds the whole model as one flat parameter vector, as BigDL's
// getParameters() compacts it, and each iteration does what BigDL's nodes do:
//
//   parameters.getWeights(localWeights).waitResult()     p.get_weights(weights).wait()
//   model.forward / backward on the node's sub-batch      mlp forward, softmax_xent, backward
//   parameters.putGradients(localGradients)               p.put_gradients(gradients)
//   parameters.aggregateGradientPartition(numModels)      p.aggregate_gradient_partition(nodes)
//   optimMethod.optimize(_ => (loss, gradientPartition),  sgd with momentum on
//                        weightPartition)                   p.weight_partition(), on the node
//   parameters.sendWeightPartition()                      p.send_weight_partition()
//
// The weights and gradients travel in BigDL's "fp16" (the float's high 16 bits) by default; each
// node's weight partition, which its optimizer steps, stays full precision.
//
//   kv_launch -w 2 --colocated -- bigdl_mnist                       fp16, as BigDL's default
//   kv_launch -w 2 --colocated -- bigdl_mnist --compress none       uncompressed
//   kv_launch -w 2 --colocated -- bigdl_mnist --compare --target 0.78
//       trains uncompressed, then fp16 from the same start on the same batches, prints both test
//       accuracies and exits 1 when fp16 falls below the target or more than --tolerance below
//       the uncompressed run.
//
// The data (mnist/idx.hpp) and the model (mnist/mlp.hpp) are train_mnist's. The test accuracy is
// that of the weights every node computes with: get_weights' copies (compressed with fp16).
#include <kvstore/compat/bigdl.hpp>
#include <kvstore/kvstore.hpp>

#include "mnist/idx.hpp"
#include "mnist/mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace bigdl = kvstore::compat::bigdl;

struct flags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 1;
  std::size_t batch = 128;  // global: over every node
  double lr = 0.02, momentum = 0.9;
  std::size_t limit = 0;  // 0: every training sample
  bigdl::compress compress = bigdl::compress::fp16;
  bool compare = false;
  double target = -1;       // exit 1 below this test accuracy
  double tolerance = 0.01;  // --compare: how far fp16 may fall below the uncompressed run
  std::uint32_t seed = 42;
};

bigdl::compress compress_of(const std::string& s) {
  if (s == "fp16") return bigdl::compress::fp16;
  if (s == "bf16") return bigdl::compress::bf16;
  if (s == "none") return bigdl::compress::none;
  throw std::invalid_argument("--compress " + s + ": one of fp16, bf16, none");
}
const char* name_of(bigdl::compress c) {
  return c == bigdl::compress::fp16 ? "fp16" : c == bigdl::compress::bf16 ? "bf16" : "none";
}

flags parse(int argc, char** argv) {
  flags f;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value for ") + argv[i]);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--epochs")
      f.epochs = std::stoi(value(i));
    else if (a == "--batch")
      f.batch = std::stoul(value(i));
    else if (a == "--lr")
      f.lr = std::stod(value(i));
    else if (a == "--momentum")
      f.momentum = std::stod(value(i));
    else if (a == "--limit")
      f.limit = std::stoul(value(i));
    else if (a == "--compress")
      f.compress = compress_of(value(i));
    else if (a == "--compare")
      f.compare = true;
    else if (a == "--target")
      f.target = std::stod(value(i));
    else if (a == "--tolerance")
      f.tolerance = std::stod(value(i));
    else if (a == "--data")
      f.data_dir = value(i);
    else
      throw std::invalid_argument(
          "usage: bigdl_mnist [--epochs E] [--batch B] [--lr X] [--momentum M] [--limit N] "
          "[--compress fp16|bf16|none] [--compare] [--target ACC] [--tolerance T] [--data DIR]");
  }
  if (f.epochs < 1 || f.batch < 1) throw std::invalid_argument("bad sizes");
  return f;
}

// The model's tensors as one flat vector (BigDL's compacted parameters) and back.
void flatten(const mnist::mlp::tensors& ts, std::span<float> flat) {
  std::size_t at = 0;
  for (const auto& t : ts) at = std::copy(t.begin(), t.end(), flat.begin() + at) - flat.begin();
}
void unflatten(std::span<const float> flat, mnist::mlp::tensors& ts) {
  std::size_t at = 0;
  for (auto& t : ts) {
    std::copy_n(flat.begin() + at, t.size(), t.begin());
    at += t.size();
  }
}

double accuracy(const mnist::mlp& net, const mnist::mlp::tensors& params,
                const mnist::dataset& test) {
  constexpr std::size_t chunk = 256;
  auto ws = net.make_workspace(chunk);
  std::size_t right = 0;
  for (std::size_t s = 0; s < test.size(); s += chunk) {
    const std::size_t n = std::min(chunk, test.size() - s);
    net.forward(params, test.images.data() + s * test.cols, n, ws);
    right += net.correct(test.labels.data() + s, n, ws);
  }
  return static_cast<double>(right) / static_cast<double>(test.size());
}

struct data {
  mnist::dataset train, test;
};

// One training run of parameter `id` in compression c; returns the final test accuracy (rank 0;
// 0 elsewhere).
double train(kvstore::KVStore<kvstore::dist>& kv, const flags& f, const data& d, std::int64_t id,
             bigdl::compress c) {
  using clock = std::chrono::steady_clock;
  const int nodes = kv.num_workers(), rank = kv.rank();
  const bool lead = rank == 0;
  const std::size_t sub = f.batch / static_cast<std::size_t>(nodes);  // this node's rows
  const std::size_t steps = d.train.size() / f.batch;

  const mnist::mlp net({d.train.cols, 256, 128, 10});
  mnist::mlp::tensors params = net.initial_params(f.seed);
  std::size_t size = 0;
  for (const auto& t : params) size += t.size();
  std::vector<float> weights(size), gradients(size);
  flatten(params, weights);

  // new AllReduceParameter[Float](id, partitionNum, size, compress = ...); init(parameter).
  bigdl::AllReduceParameter<float> p(kv, id, nodes, size, c);
  const bigdl::partition_info part = p.init(weights);
  // BigDL's optimMethod, on this node's partition: kvstore's sgd, applied here. The gradients
  // are sums over a node's rows averaged over the nodes: rescale_grad makes them batch means.
  const auto sgd = kvstore::optim::make_updater<float>(
      kvstore::optim::sgd{.learning_rate = f.lr,
                          .momentum = f.momentum,
                          .rescale_grad = 1.0 / static_cast<double>(sub)});
  kvstore::optim::state<float> sgd_state;
  if (lead)
    std::printf(
        "bigdl_mnist: %s, compress %s, %d nodes (partition 0: %zu of %zu parameters), batch "
        "%zu, %zu train / %zu test samples, sgd lr %g momentum %g\n",
        kv.type().c_str(), name_of(c), nodes, part.length, size, f.batch, d.train.size(),
        d.test.size(), f.lr, f.momentum);

  auto ws = net.make_workspace(sub);
  std::vector<float> x(sub * d.train.cols);
  std::vector<std::uint8_t> y(sub);
  std::vector<std::size_t> order(d.train.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto start = clock::now();
  double acc = 0;
  for (int epoch = 1; epoch <= f.epochs; ++epoch) {
    std::mt19937_64 gen(f.seed * 1000003ull + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), gen);  // the same on every node
    for (std::size_t b = 0; b < steps; ++b) {
      p.get_weights(weights).wait();
      unflatten(weights, params);
      const std::size_t* rows = order.data() + b * f.batch + static_cast<std::size_t>(rank) * sub;
      for (std::size_t i = 0; i < sub; ++i) {
        std::copy_n(d.train.images.data() + rows[i] * d.train.cols, d.train.cols,
                    x.data() + i * d.train.cols);
        y[i] = d.train.labels[rows[i]];
      }
      net.forward(params, x.data(), sub, ws);
      net.softmax_xent(y.data(), sub, ws);
      net.backward(params, x.data(), sub, ws);
      flatten(ws.grads, gradients);
      p.put_gradients(gradients);
      p.aggregate_gradient_partition(nodes);
      sgd.apply(p.weight_key(), p.gradient_partition(), p.weight_partition(), sgd_state);
      p.send_weight_partition();
    }
    p.get_weights(weights).wait();
    if (lead) {
      unflatten(weights, params);
      acc = accuracy(net, params, d.test);
      std::printf("compress %s  epoch %d  test accuracy %.4f  (%.1f s)\n", name_of(c), epoch, acc,
                  std::chrono::duration<double>(clock::now() - start).count());
      std::fflush(stdout);
    }
    kv.barrier();
  }
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const flags f = parse(argc, argv);
    kvstore::KVStore<kvstore::dist> kv;  // from the environment: kv_launch --colocated
    const auto nodes = static_cast<std::size_t>(kv.num_workers());
    if (f.batch % nodes != 0)
      throw std::invalid_argument("--batch " + std::to_string(f.batch) + " does not split into " +
                                  std::to_string(nodes) + " equal sub-batches");
    data d;
    d.train = mnist::load(f.data_dir, "train", f.limit);
    const auto stats = mnist::stats_of(d.train);
    mnist::standardize(d.train, stats);
    d.test = mnist::load(f.data_dir, "t10k");
    mnist::standardize(d.test, stats);
    if (d.train.size() < f.batch) throw std::invalid_argument("fewer samples than one batch");

    if (!f.compare) {
      const double acc = train(kv, f, d, 1, f.compress);
      if (kv.rank() == 0 && f.target >= 0 && acc < f.target) {
        std::fprintf(stderr, "bigdl_mnist: test accuracy %.4f is below the target %.4f\n", acc,
                     f.target);
        return 1;
      }
      return 0;
    }
    // The same start and batches twice: uncompressed (parameter 1), then fp16 (parameter 2).
    const double plain = train(kv, f, d, 1, bigdl::compress::none);
    const double fp16 = train(kv, f, d, 2, bigdl::compress::fp16);
    if (kv.rank() != 0) return 0;
    std::printf("bigdl_mnist: test accuracy uncompressed %.4f, fp16 %.4f (difference %+.4f)\n",
                plain, fp16, fp16 - plain);
    if (f.target >= 0 && fp16 < f.target) {
      std::fprintf(stderr, "bigdl_mnist: fp16's test accuracy %.4f is below the target %.4f\n",
                   fp16, f.target);
      return 1;
    }
    if (fp16 < plain - f.tolerance) {
      std::fprintf(stderr,
                   "bigdl_mnist: fp16's test accuracy %.4f is more than %.4f below the "
                   "uncompressed %.4f\n",
                   fp16, f.tolerance, plain);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bigdl_mnist: %s\n", e.what());
    return 2;
  }
}
