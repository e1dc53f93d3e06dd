// singa_mnist: SINGA's "data partition within group" training the Fashion-MNIST MLP. A group of
// N worker threads shares one model: each batch is cut into N sub-batches, each worker runs
// forward and backward on its own with its own copy of the parameters, and sends each layer's
// gradient to the group as soon as backprop has it (SINGA's update); the last of the N pushes
// the group's mean to the store, which runs SGD with momentum, once per param per step. Before
// the next step every worker collects the params of that step.
//
//   singa_mnist --workers 4                      one process, KVStore<local>
//   kv_launch -w 2 -s 1 -- singa_mnist --dist    one group per process (dist_sync: a step is
//                                                the mean over every worker of the job)
//
// The data (mnist/idx.hpp) and the model (mnist/mlp.hpp) are train_mnist's.
#include <kvstore/compat/singa.hpp>
#include <kvstore/kvstore.hpp>

#include "mnist/idx.hpp"
#include "mnist/mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct flags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int workers = 4;  // threads of the group
  int epochs = 1;
  std::size_t batch = 128;  // global: over every worker of every group
  double lr = 0.02, momentum = 0.9;
  std::size_t limit = 0;  // 0: every training sample
  double target = -1;     // exit 1 below this test accuracy
  bool dist = false;
  std::uint32_t seed = 42;
};

flags parse(int argc, char** argv) {
  flags f;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value for ") + argv[i]);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--workers")
      f.workers = std::stoi(value(i));
    else if (a == "--epochs")
      f.epochs = std::stoi(value(i));
    else if (a == "--batch")
      f.batch = std::stoul(value(i));
    else if (a == "--lr")
      f.lr = std::stod(value(i));
    else if (a == "--momentum")
      f.momentum = std::stod(value(i));
    else if (a == "--limit")
      f.limit = std::stoul(value(i));
    else if (a == "--target")
      f.target = std::stod(value(i));
    else if (a == "--data")
      f.data_dir = value(i);
    else if (a == "--dist")
      f.dist = true;
    else
      throw std::invalid_argument(
          "usage: singa_mnist [--workers N] [--epochs E] [--batch B] [--lr X] [--momentum M] "
          "[--limit N] [--target ACC] [--data DIR] [--dist]");
  }
  if (f.workers < 1 || f.epochs < 1 || f.batch < 1) throw std::invalid_argument("bad sizes");
  return f;
}

// Fraction of `test` the params get right, the rows spread over `threads` threads.
double accuracy(const mnist::mlp& net, const mnist::mlp::tensors& params,
                const mnist::dataset& test, int threads) {
  constexpr std::size_t chunk = 256;
  std::vector<std::size_t> right(static_cast<std::size_t>(threads), 0);
  std::vector<std::thread> ts;
  const std::size_t per = (test.size() + right.size() - 1) / right.size();
  for (std::size_t t = 0; t < right.size(); ++t)
    ts.emplace_back([&, t] {
      auto ws = net.make_workspace(chunk);
      const std::size_t end = std::min(test.size(), (t + 1) * per);
      for (std::size_t s = t * per; s < end; s += chunk) {
        const std::size_t n = std::min(chunk, end - s);
        net.forward(params, test.images.data() + s * test.cols, n, ws);
        right[t] += net.correct(test.labels.data() + s, n, ws);
      }
    });
  for (auto& t : ts) t.join();
  return static_cast<double>(std::accumulate(right.begin(), right.end(), std::size_t{0})) /
         static_cast<double>(test.size());
}

template <class Store>
int train(Store& kv, const flags& f) {
  namespace singa = kvstore::compat::singa;
  const auto n = static_cast<std::size_t>(f.workers);
  const auto groups = static_cast<std::size_t>(kv.num_workers());
  const std::size_t group = static_cast<std::size_t>(kv.rank());
  const bool lead = group == 0;
  if (f.batch % (n * groups) != 0)
    throw std::invalid_argument("--batch " + std::to_string(f.batch) + " does not split into " +
                                std::to_string(n * groups) + " equal sub-batches");
  const std::size_t sub = f.batch / (n * groups);

  mnist::dataset train = mnist::load(f.data_dir, "train", f.limit);
  const auto stats = mnist::stats_of(train);
  mnist::standardize(train, stats);
  mnist::dataset test = mnist::load(f.data_dir, "t10k");
  mnist::standardize(test, stats);
  const std::size_t steps = train.size() / f.batch;
  if (steps == 0) throw std::invalid_argument("fewer training samples than one batch");

  const mnist::mlp net({train.cols, 256, 128, 10});
  std::vector<std::string> names;
  for (std::size_t t = 0; t < net.num_tensors(); ++t) names.push_back(mnist::mlp::tensor_name(t));
  // A worker's gradients are sums over its sub-batch: rescale_grad turns the group's mean of
  // them into the batch mean.
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = f.lr,
                                       .momentum = f.momentum,
                                       .rescale_grad = 1.0 / static_cast<double>(sub)});
  singa::WorkerGroup<Store> team(kv, f.workers);
  if (lead)
    std::printf(
        "singa_mnist: %s, %zu group(s) x %zu worker thread(s), sub-batch %zu of batch %zu, "
        "%zu train / %zu test samples, sgd lr %g momentum %g\n",
        kv.type().c_str(), groups, n, sub, f.batch, train.size(), test.size(), f.lr, f.momentum);

  const mnist::mlp::tensors initial = net.initial_params(f.seed);
  std::vector<std::size_t> order(train.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  int step = 0;  // steps done, the params' version
  double acc = 0;
  const auto start = std::chrono::steady_clock::now();

  // Worker w of this group: owner of the tensors t with t % N == w; trains `steps` steps.
  auto worker = [&](int w, int first_step) {
    mnist::mlp::tensors params = net.zeros();
    auto ws = net.make_workspace(sub);
    std::vector<float> x(sub * train.cols);
    std::vector<std::uint8_t> y(sub);
    if (first_step == 0)
      for (std::size_t t = static_cast<std::size_t>(w); t < names.size(); t += n)
        team.put(w, names[t], initial[t]);
    for (std::size_t t = 0; t < names.size(); ++t) team.collect(w, names[t], first_step, params[t]);
    for (std::size_t b = 0; b < steps; ++b) {
      const int s = first_step + static_cast<int>(b);  // SINGA numbers steps from 0
      // This worker's sub-batch: part (group * N + w) of batch b.
      const std::size_t* rows =
          order.data() + b * f.batch + (group * n + static_cast<std::size_t>(w)) * sub;
      for (std::size_t i = 0; i < sub; ++i) {
        std::copy_n(train.images.data() + rows[i] * train.cols, train.cols,
                    x.data() + i * train.cols);
        y[i] = train.labels[rows[i]];
      }
      net.forward(params, x.data(), sub, ws);
      net.softmax_xent(y.data(), sub, ws);
      net.backward(params, x.data(), sub, ws, [&](std::size_t layer) {
        for (std::size_t t : {2 * layer, 2 * layer + 1}) team.update(w, names[t], ws.grads[t], s);
      });
      // The next step's params: version s + 1.
      for (std::size_t t = 0; t < names.size(); ++t) team.collect(w, names[t], s + 1, params[t]);
    }
  };

  for (int epoch = 1; epoch <= f.epochs; ++epoch) {
    std::mt19937_64 gen(f.seed * 1000003ull + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), gen);  // the same on every group
    std::vector<std::thread> ts;
    std::exception_ptr failed;
    std::mutex fm;
    for (int w = 0; w < f.workers; ++w)
      ts.emplace_back([&, w] {
        try {
          worker(w, step);
        } catch (...) {
          std::lock_guard lk(fm);
          if (!failed) failed = std::current_exception();
        }
      });
    for (auto& t : ts) t.join();
    if (failed) std::rethrow_exception(failed);
    step += static_cast<int>(steps);

    mnist::mlp::tensors params = net.zeros();
    for (std::size_t t = 0; t < names.size(); ++t) team.collect(0, names[t], step, params[t]);
    kv.barrier();  // (dist) every group's last step is in before the lead scores
    if (lead) {
      acc = accuracy(net, params, test, f.workers);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("epoch %d  test accuracy %.4f  version %llu  (%.1f s)\n", epoch, acc,
                  static_cast<unsigned long long>(team.version(names[0])), secs);
    }
    kv.barrier();
  }
  if (lead && f.target >= 0 && acc < f.target) {
    std::fprintf(stderr, "singa_mnist: test accuracy %.4f is below the target %.4f\n", acc,
                 f.target);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const flags f = parse(argc, argv);
    if (f.dist) {
      kvstore::KVStore<kvstore::dist> kv;  // one group per process, from the environment
      return train(kv, f);
    }
    kvstore::KVStore<kvstore::local> kv;
    return train(kv, f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "singa_mnist: %s\n", e.what());
    return 2;
  }
}
