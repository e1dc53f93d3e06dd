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
// The trainer is written once, as run<Mode>, against the public API only (docs API.md), so the
// distributed mode is the same code with another mode tag.

#include <kvstore/kvstore.hpp>

#include "mnist/idx.hpp"
#include "mnist/mlp.hpp"
#ifdef KVSTORE_EXAMPLE_DEVICES
#include "mnist/data_parallel_train.hpp"
#endif

#include <algorithm>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct args {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 3;
  std::size_t batch = 128;  // global: summed over all workers
  double lr = 0.02;
  double momentum = 0.9;
  double weight_decay = 0;
  std::size_t limit = 0;  // 0 = every training sample
  double target = -1;     // < 0: no check
  unsigned threads = 0;   // compute threads per worker; 0 = cores / workers
  bool local = false;
  int devices = 0;  // > 0: DataParallelTable over KVStore<device> with this many devices
  std::vector<std::size_t> hidden = {256, 128};
  std::uint32_t seed = 42;
};

const char* const usage =
    "usage: train_mnist [--local] [options]\n"
    "  --local          train with KVStore<local> in this process (else: dist, via kv_launch)\n"
    "  --devices N      train data-parallel over N devices with DataParallelTable (device build)\n"
    "  --data DIR       Fashion-MNIST IDX files, plain or .gz (/usr/share/datasets/fashion-mnist)\n"
    "  --epochs N       passes over the training set (3)\n"
    "  --batch B        global mini-batch, split evenly over the workers (128)\n"
    "  --lr X           learning rate of SGD (0.02)\n"
    "  --momentum X     momentum of SGD (0.9)\n"
    "  --wd X           weight decay (0)\n"
    "  --hidden A,B,..  hidden layer sizes (256,128)\n"
    "  --limit N        use only the first N training samples (all)\n"
    "  --threads T      compute threads per worker (cores / workers)\n"
    "  --seed S         seed of the initial weights and the shuffles (42)\n"
    "  --target ACC     exit 1 if the final test accuracy is below ACC (0..1)\n";

[[noreturn]] void die(const std::string& msg) {
  std::cerr << "train_mnist: " << msg << "\n" << usage;
  std::exit(2);
}

template <class N>
N parse_number(const std::string& flag, const std::string& s) {
  std::istringstream in(s);
  N v{};
  if (!(in >> v) || !in.eof()) die("bad value '" + s + "' for " + flag);
  return v;
}

args parse_args(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    bool has_value = false;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) die("missing value for " + flag);
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      std::exit(0);
    } else if (flag == "--local") {
      a.local = true;
    } else if (flag == "--devices") {
      a.devices = parse_number<int>(flag, next());
    } else if (flag == "--data") {
      a.data_dir = next();
    } else if (flag == "--epochs") {
      a.epochs = parse_number<int>(flag, next());
    } else if (flag == "--batch") {
      a.batch = parse_number<std::size_t>(flag, next());
    } else if (flag == "--lr") {
      a.lr = parse_number<double>(flag, next());
    } else if (flag == "--momentum") {
      a.momentum = parse_number<double>(flag, next());
    } else if (flag == "--wd") {
      a.weight_decay = parse_number<double>(flag, next());
    } else if (flag == "--limit") {
      a.limit = parse_number<std::size_t>(flag, next());
    } else if (flag == "--threads") {
      a.threads = parse_number<unsigned>(flag, next());
    } else if (flag == "--seed") {
      a.seed = parse_number<std::uint32_t>(flag, next());
    } else if (flag == "--target") {
      a.target = parse_number<double>(flag, next());
    } else if (flag == "--hidden") {
      a.hidden.clear();
      std::istringstream in(next());
      for (std::string part; std::getline(in, part, ',');) {
        a.hidden.push_back(parse_number<std::size_t>(flag, part));
      }
    } else {
      die("unknown option " + flag);
    }
  }
  if (a.epochs < 1) die("--epochs must be at least 1");
  if (a.batch < 1) die("--batch must be at least 1");
  if (!(a.lr > 0)) die("--lr must be positive");
  for (std::size_t h : a.hidden)
    if (h == 0) die("--hidden sizes must be positive");
  return a;
}

/// A fixed team of threads that runs one function on all of them and joins: the caller is
/// member 0. Kept alive across steps because a step is only a few milliseconds and starting
/// threads each time would show.
class team {
 public:
  explicit team(unsigned size) : size_(size) {
    for (unsigned i = 1; i < size_; ++i) helpers_.emplace_back([this, i] { serve(i); });
  }
  team(const team&) = delete;
  team& operator=(const team&) = delete;
  ~team() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  unsigned size() const { return size_; }

  /// Runs f(member) on every member and returns when all are done; rethrows the first exception.
  void run(const std::function<void(unsigned)>& f) {
    {
      std::lock_guard lk(m_);
      job_ = &f;
      pending_ = size_ - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    std::exception_ptr mine;
    try {
      f(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock lk(m_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void serve(unsigned member) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(unsigned)>* job = nullptr;
      {
        std::unique_lock lk(m_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      std::exception_ptr e;
      try {
        (*job)(member);
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard lk(m_);
      if (e && !error_) error_ = e;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  unsigned size_;
  std::vector<std::thread> helpers_;
  std::mutex m_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  const std::function<void(unsigned)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  unsigned pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

/// Fraction of the test set the model gets right, the rows spread over the team.
double evaluate(const mnist::mlp& net, const mnist::mlp::tensors& params, const mnist::dataset& test,
                team& crew) {
  constexpr std::size_t chunk = 256;
  std::vector<std::size_t> correct(crew.size(), 0);
  crew.run([&](unsigned t) {
    auto ws = net.make_workspace(chunk);
    const std::size_t per = (test.size() + crew.size() - 1) / crew.size();
    const std::size_t begin = std::min(test.size(), t * per);
    const std::size_t end = std::min(test.size(), begin + per);
    for (std::size_t s = begin; s < end; s += chunk) {
      const std::size_t rows = std::min(chunk, end - s);
      net.forward(params, test.images.data() + s * test.cols, rows, ws);
      correct[t] += net.correct(test.labels.data() + s, rows, ws);
    }
  });
  const std::size_t total = std::accumulate(correct.begin(), correct.end(), std::size_t{0});
  return test.size() ? static_cast<double>(total) / static_cast<double>(test.size()) : 0.0;
}

/// Per-thread state of one worker: its rows of the current batch and its scratch.
struct member_state {
  mnist::mlp::workspace ws;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  double loss = 0;
};

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

  unsigned threads = a.threads;
  if (threads == 0) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    threads = std::max(1u, cores / static_cast<unsigned>(workers));
  }
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, local_batch));
  team crew(threads);

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
  for (std::size_t t = 0; t < net.num_tensors(); ++t) kv.pull(names[t], std::span<float>(params[t]));
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

  std::vector<member_state> members(threads);
  const std::size_t per_member = (local_batch + threads - 1) / threads;
  for (auto& m : members) {
    m.ws = net.make_workspace(per_member);
    m.x.resize(per_member * train.cols);
    m.y.resize(per_member);
  }
  // One phase per layer of backprop: member 0 may sum the members' gradients of a layer only
  // once all of them have finished it.
  std::barrier layer_sync(static_cast<std::ptrdiff_t>(threads));

  std::vector<std::size_t> order(train.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::exception_ptr store_error;
  double accuracy = 0;
  double train_seconds = 0;
  const auto start = clock::now();

  for (int epoch = 1; epoch <= a.epochs; ++epoch) {
    // The same shuffle on every worker (same seed), so their slices of a batch are disjoint.
    std::mt19937_64 shuffle_gen(a.seed * 1000003ull + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), shuffle_gen);
    for (auto& m : members) m.loss = 0;
    const auto epoch_start = clock::now();

    for (std::size_t step = 0; step < steps; ++step) {
      // This worker's slice of global batch `step`: the batches r, r+W, r+2W, ... of size B/W.
      const std::size_t base = step * a.batch + static_cast<std::size_t>(rank) * local_batch;
      crew.run([&](unsigned t) {
        member_state& m = members[t];
        const std::size_t begin = std::min(local_batch, t * per_member);
        const std::size_t rows = std::min(local_batch, begin + per_member) - begin;
        for (std::size_t i = 0; i < rows; ++i) {
          const std::size_t src = order[base + begin + i];
          std::copy_n(train.images.data() + src * train.cols, train.cols,
                      m.x.data() + i * train.cols);
          m.y[i] = train.labels[src];
        }
        net.forward(params, m.x.data(), rows, m.ws);
        m.loss += net.softmax_xent(m.y.data(), rows, m.ws);
        net.backward(params, m.x.data(), rows, m.ws, [&](std::size_t layer) {
          layer_sync.arrive_and_wait();
          if (t != 0) return;
          // All members are past this layer, so its weights are no longer read this step and
          // its gradients are final: sum them into member 0's, push, and pull the new weights
          // into the live parameters. Earlier layers get higher priority (-layer, as MXNet
          // does): their weights are the first the next forward pass needs.
          // A store error is kept for after the step rather than thrown here: the other
          // members would wait at the next layer's barrier forever.
          if (store_error) return;
          const int priority = -static_cast<int>(layer);
          try {
            for (std::size_t tensor : {2 * layer, 2 * layer + 1}) {
              std::vector<float>& g = members[0].ws.grads[tensor];
              for (unsigned o = 1; o < threads; ++o) {
                const std::vector<float>& go = members[o].ws.grads[tensor];
                for (std::size_t i = 0; i < g.size(); ++i) g[i] += go[i];
              }
              kv.push(names[tensor], std::span<const float>(g), priority);
              kv.pull(names[tensor], std::span<float>(params[tensor]), priority);
            }
          } catch (...) {
            store_error = std::current_exception();
          }
        });
      });
      if (store_error) {
        kv.wait_all();  // let what was issued finish before the buffers go away
        std::rethrow_exception(store_error);
      }
      // The gradients are read by the pushes and the weights written by the pulls until done.
      kv.wait_all();
    }
    const double seconds = std::chrono::duration<double>(clock::now() - epoch_start).count();
    train_seconds += seconds;
    // The loss is over this worker's samples only (rank 0's half with two workers): the store
    // has no side channel for statistics, and a push would be taken for a gradient.
    double loss = 0;
    for (const auto& m : members) loss += m.loss;
    loss /= static_cast<double>(steps * local_batch);

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
      accuracy = evaluate(net, params, test, crew);
      const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
      char line[200];
      std::snprintf(line, sizeof line,
                    "epoch %d  train loss %.4f  test accuracy %.4f  %.0f samples/s  (%.1f s "
                    "elapsed)",
                    epoch, loss, accuracy,
                    static_cast<double>(steps * a.batch) / seconds, elapsed);
      say(line);
    }
    kv.barrier();
  }

  if (lead) {
    char line[200];
    std::snprintf(line, sizeof line,
                  "done: test accuracy %.4f, %.0f samples/s over %.1f s of training", accuracy,
                  static_cast<double>(steps * a.batch * static_cast<std::size_t>(a.epochs)) /
                      train_seconds,
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
  const args a = parse_args(argc, argv);
  try {
    if (a.devices > 0) {
#ifdef KVSTORE_EXAMPLE_DEVICES
      return mnist::train_data_parallel({a.data_dir, a.devices, a.epochs, a.batch, a.lr, a.momentum,
                                         a.weight_decay, a.limit, a.hidden, a.seed, a.target});
#else
      die("--devices needs a build with the device store (KVSTORE_BUILD_DEVICE)");
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
