// Data-parallel training of an MLP on Fashion-MNIST through a kvstore (MXNet's KVStore recipe).
//
//   train_mnist --local                      one process, the local store
//   kv_launch -w 2 -s 2 -- train_mnist       two workers and two servers (dist mode)
//
// Each layer tensor is one key ("fc1.w", "fc1.b", ...). Every worker inits the keys with the
// same deterministic weights (the store keeps rank 0's), the store runs SGD with momentum, and
// every step each worker computes the gradient of its slice of the global batch, pushes it layer
// by layer while backprop is still running, and pulls the new weights. The store sums the
// workers' gradients; rescale_grad = 1 / global batch turns the sum into the batch mean, so the
// same flags train the same model whatever the number of workers.
//
// The trainer is written once, as run<Mode>, against the public API only (docs/API_REFERENCE.md),
// so the distributed mode is the same code with another mode tag. The command line
// (mnist/args.hpp), the data (mnist/idx.hpp), the model (mnist/mlp.hpp) and the worker's compute
// threads (mnist/team.hpp) live beside it; this file is the use of the store.

#include <kvstore/kvstore.hpp>

#include "mnist/args.hpp"
#include "mnist/idx.hpp"
#include "mnist/mlp.hpp"
#include "mnist/team.hpp"
#ifdef KVSTORE_EXAMPLE_DEVICES
#include "mnist/data_parallel_train.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using mnist::args;

template <class Mode>
int run(const args& a) {
  using clock = std::chrono::steady_clock;
  kvstore::KVStore<Mode> kv;
  const int rank = kv.rank();
  const int workers = kv.num_workers();
  const bool lead = rank == 0;
  auto say = [&](const std::string& line) {
    if (lead) std::cout << line << std::endl;
  };

  if (a.batch % static_cast<std::size_t>(workers) != 0) {
    throw std::runtime_error("--batch " + std::to_string(a.batch) + " does not split evenly over " +
                             std::to_string(workers) + " workers");
  }
  const std::size_t local_batch = a.batch / static_cast<std::size_t>(workers);

  // Data: every worker loads the training set (it only reads its slices of it); the test set is
  // needed by rank 0 alone. Inputs are standardized with the training set's pixel statistics.
  mnist::dataset train = mnist::load(a.data_dir, "train", a.limit);
  const mnist::pixel_stats stats = mnist::stats_of(train);
  mnist::standardize(train, stats);
  mnist::dataset test;
  if (lead) {
    test = mnist::load(a.data_dir, "t10k");
    mnist::standardize(test, stats);
  }
  const std::size_t steps = train.size() / a.batch;  // whole global batches only: in dist_sync
                                                     // every worker must do the same rounds
  if (steps == 0) {
    throw std::runtime_error("only " + std::to_string(train.size()) +
                             " training samples: fewer than one batch of " +
                             std::to_string(a.batch));
  }

  std::vector<std::size_t> sizes{train.cols};
  sizes.insert(sizes.end(), a.hidden.begin(), a.hidden.end());
  sizes.push_back(10);
  const mnist::mlp net(sizes);

  mnist::batch_team team(net, mnist::threads_per_worker(a.threads, workers, local_batch),
                         local_batch, train.cols);
  const unsigned threads = team.threads();

  // Keys and initial weights. Every worker computes the same deterministic weights and calls
  // init; the store keeps rank 0's and returns once it is stored, so the pulls below never race.
  std::vector<std::string> names;
  for (std::size_t t = 0; t < net.num_tensors(); ++t) names.push_back(mnist::mlp::tensor_name(t));
  mnist::mlp::tensors params = net.initial_params(a.seed);
  for (std::size_t t = 0; t < net.num_tensors(); ++t) {
    kv.init(names[t], std::span<const float>(params[t]));
  }
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = a.lr,
                                       .momentum = a.momentum,
                                       .weight_decay = a.weight_decay,
                                       .rescale_grad = 1.0 / static_cast<double>(a.batch)});
  // Start from the stored weights (rank 0's), whatever this worker computed.
  for (std::size_t t = 0; t < net.num_tensors(); ++t)
    kv.pull(names[t], std::span<float>(params[t]));
  kv.wait_all();
  kv.barrier();

  {
    std::ostringstream os;
    os << "train_mnist: " << kv.type() << ", " << workers << " worker(s) x " << threads
       << " thread(s), mlp";
    for (std::size_t s : sizes) os << (s == sizes.front() ? " " : "-") << s;
    os << ", " << train.size() << " train / " << test.size() << " test samples, batch " << a.batch
       << " (" << local_batch << " per worker), sgd lr " << a.lr << " momentum " << a.momentum
       << ", " << a.epochs << " epoch(s)";
    say(os.str());
  }

  // After each layer of backprop, its gradients summed over this worker's threads: push them and
  // pull the new weights into the live parameters. Earlier layers get higher priority (-layer, as
  // MXNet does): their weights are the first the next forward pass needs.
  auto push_pull_layer = [&](std::size_t layer) {
    const int priority = -static_cast<int>(layer);
    for (std::size_t tensor : {2 * layer, 2 * layer + 1}) {
      kv.push(names[tensor], std::span<const float>(team.grad(tensor)), priority);
      kv.pull(names[tensor], std::span<float>(params[tensor]), priority);
    }
  };

  std::vector<std::size_t> order(train.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  double accuracy = 0;
  double train_seconds = 0;
  const auto start = clock::now();

  for (int epoch = 1; epoch <= a.epochs; ++epoch) {
    // The same shuffle on every worker (same seed), so their slices of a batch are disjoint.
    std::mt19937_64 shuffle_gen(a.seed * 1000003ull + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), shuffle_gen);
    team.reset_loss();
    const auto epoch_start = clock::now();

    for (std::size_t step = 0; step < steps; ++step) {
      // This worker's slice of global batch `step`: the batches r, r+W, r+2W, ... of size B/W.
      const std::size_t* rows =
          order.data() + step * a.batch + static_cast<std::size_t>(rank) * local_batch;
      try {
        team.step(params, train, rows, push_pull_layer);
      } catch (...) {
        kv.wait_all();  // let what was issued finish before the buffers go away
        throw;
      }
      // The gradients are read by the pushes and the weights written by the pulls until done.
      kv.wait_all();
    }
    const double seconds = std::chrono::duration<double>(clock::now() - epoch_start).count();
    train_seconds += seconds;
    // The loss is over this worker's samples only (rank 0's half with two workers): the store
    // has no side channel for statistics, and a push would be taken for a gradient.
    const double loss = team.loss() / static_cast<double>(steps * local_batch);

    // Everyone has finished the epoch before rank 0 scores the weights. In dist_sync rank 0's
    // last pull already saw the last round; in dist_async other workers' last pushes may have
    // landed after it, hence the fresh pull. The second barrier keeps the others waiting there
    // (not in their next pull, whose deadline knows nothing of evaluation) while rank 0 scores.
    kv.barrier();
    if (lead) {
      for (std::size_t t = 0; t < net.num_tensors(); ++t) {
        kv.pull(names[t], std::span<float>(params[t]));
      }
      kv.wait_all();
      accuracy = team.evaluate(params, test);
      const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
      char line[200];
      std::snprintf(line, sizeof line,
                    "epoch %d  train loss %.4f  test accuracy %.4f  %.0f samples/s  (%.1f s "
                    "elapsed)",
                    epoch, loss, accuracy, static_cast<double>(steps * a.batch) / seconds, elapsed);
      say(line);
    }
    kv.barrier();
  }

  if (lead) {
    char line[200];
    std::snprintf(
        line, sizeof line, "done: test accuracy %.4f, %.0f samples/s over %.1f s of training",
        accuracy,
        static_cast<double>(steps * a.batch * static_cast<std::size_t>(a.epochs)) / train_seconds,
        train_seconds);
    say(line);
    if (a.target >= 0 && accuracy < a.target) {
      std::cerr << "train_mnist: test accuracy " << accuracy << " is below the target " << a.target
                << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const args a = mnist::parse_args(argc, argv);
  try {
    if (a.devices > 0) {
#ifdef KVSTORE_EXAMPLE_DEVICES
      return mnist::train_data_parallel({a.data_dir, a.devices, a.epochs, a.batch, a.lr, a.momentum,
                                         a.weight_decay, a.limit, a.hidden, a.seed, a.target});
#else
      std::cerr
          << "train_mnist: --devices needs a build with the device store (KVSTORE_BUILD_DEVICE)\n";
      return 2;
#endif
    }
    if (a.local) return run<kvstore::local>(a);
    // Distributed: roles and sizes from the environment (kv_launch, mpirun, srun, torchrun...).
    return run<kvstore::dist>(a);
  } catch (const std::exception& e) {
    std::cerr << "train_mnist: " << e.what() << "\n";
    return 1;
  }
}
