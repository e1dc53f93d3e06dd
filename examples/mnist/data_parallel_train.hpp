// train_mnist --devices N: Torch cunn's DataParallelTable recipe over KVStore<device>. N replicas
// of the MLP, one per device (virtual devices over host memory with Thrust's OMP backend), each
// computes the gradient of its slice of every batch (slice_range, as cunn splits it);
// acc_grad_parameters sums the replicas' gradients into the primary's on its device, SGD with
// momentum updates the primary (rescale 1 / batch: the batch mean, as the --local run), and
// sync_parameters broadcasts the new weights to every replica. One table per layer tensor.
//
// The MLP computes on the host, so the replicas' buffers are host memory named as virtual
// devices: this trainer is for the OMP build (a CUDA build of it would need GPU layers).
#pragma once

#include <kvstore/compat/data_parallel.hpp>
#include <kvstore/device.hpp>
#include <kvstore/optim/sgd.hpp>

#include "idx.hpp"
#include "mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace mnist {

struct data_parallel_options {
  std::filesystem::path data_dir;
  int devices = 2;
  int epochs = 3;
  std::size_t batch = 128;
  double lr = 0.02, momentum = 0.9, weight_decay = 0;
  std::size_t limit = 0;
  std::vector<std::size_t> hidden;
  std::uint32_t seed = 42;
  double target = -1;
};

/// Trains and prints one line per epoch; returns 1 when the final test accuracy is below
/// o.target, else 0. Throws on bad data or a store error.
inline int train_data_parallel(const data_parallel_options& o) {
  using clock = std::chrono::steady_clock;
  using store = kvstore::KVStore<kvstore::device, float>;
  using table = kvstore::compat::DataParallelTable<store>;
  if (o.devices < 1) throw std::runtime_error("--devices must be at least 1");
  const auto n = static_cast<std::size_t>(o.devices);

  dataset train = load(o.data_dir, "train", o.limit);
  const pixel_stats stats = stats_of(train);
  standardize(train, stats);
  dataset test = load(o.data_dir, "t10k");
  standardize(test, stats);
  const std::size_t steps = train.size() / o.batch;
  if (steps == 0) throw std::runtime_error("fewer training samples than one batch");

  std::vector<std::size_t> sizes{train.cols};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(10);
  const mlp net(sizes);

  std::vector<int> devs(n);
  std::iota(devs.begin(), devs.end(), 0);
  store kv(kvstore::device_options{.devices = devs, .placement = kvstore::placement::first});

  // Replica r: its parameters, its workspace (gradients included) and its rows of a batch.
  const std::size_t per = (o.batch + n - 1) / n;
  std::vector<mlp::tensors> params(n, net.initial_params(o.seed));
  std::vector<mlp::workspace> ws;
  std::vector<std::vector<float>> xs(n, std::vector<float>(per * train.cols));
  std::vector<std::vector<std::uint8_t>> ys(n, std::vector<std::uint8_t>(per));
  std::vector<double> losses(n, 0);
  for (std::size_t r = 0; r < n; ++r) ws.push_back(net.make_workspace(per));
  std::vector<table> tables;
  for (std::size_t t = 0; t < net.num_tensors(); ++t) {
    tables.emplace_back(kv);
    for (std::size_t r = 0; r < n; ++r) {
      const int d = devs[r];
      tables.back().add(
          kvstore::device_span<float>{params[r][t].data(), params[r][t].size(), d},
          kvstore::device_span<float>{ws[r].grads[t].data(), ws[r].grads[t].size(), d});
    }
  }
  const kvstore::optim::sgd sgd{.learning_rate = o.lr,
                                .momentum = o.momentum,
                                .weight_decay = o.weight_decay,
                                .rescale_grad = 1.0 / static_cast<double>(o.batch)};
  mlp::tensors mom = net.zeros();

  std::printf(
      "train_mnist: device (DataParallelTable), %zu replica(s) on %s device(s), batch %zu, sgd lr "
      "%g "
      "momentum %g, %d epoch(s)\n",
      n, kvstore::detail::rt::is_cuda ? "CUDA" : "virtual", o.batch, o.lr, o.momentum, o.epochs);
  std::vector<std::size_t> order(train.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  double accuracy = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    std::mt19937_64 gen(o.seed * 1000003ull + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), gen);
    std::fill(losses.begin(), losses.end(), 0.0);
    const auto start = clock::now();
    for (std::size_t step = 0; step < steps; ++step) {
      auto replica = [&](std::size_t r) {
        const auto [begin, rows] =
            table::slice_range(o.batch, static_cast<int>(r), static_cast<int>(n));
        for (std::size_t i = 0; i < rows; ++i) {
          const std::size_t src = order[step * o.batch + begin + i];
          std::copy_n(train.images.data() + src * train.cols, train.cols,
                      xs[r].data() + i * train.cols);
          ys[r][i] = train.labels[src];
        }
        net.forward(params[r], xs[r].data(), rows, ws[r]);
        losses[r] += net.softmax_xent(ys[r].data(), rows, ws[r]);
        net.backward(params[r], xs[r].data(), rows, ws[r]);
      };
      std::vector<std::thread> others;
      for (std::size_t r = 1; r < n; ++r) others.emplace_back(replica, r);
      replica(0);
      for (auto& t : others) t.join();
      for (std::size_t t = 0; t < net.num_tensors(); ++t) {
        tables[t].acc_grad_parameters();
        kvstore::optim::slots_view<float> view;
        view.slot[0] = mom[t];
        sgd.update<float>(ws[0].grads[t], params[0][t], view);
        tables[t].sync_parameters();
      }
    }
    const double seconds = std::chrono::duration<double>(clock::now() - start).count();
    std::size_t right = 0;
    constexpr std::size_t chunk = 256;
    auto ews = net.make_workspace(chunk);
    for (std::size_t s = 0; s < test.size(); s += chunk) {
      const std::size_t rows = std::min(chunk, test.size() - s);
      net.forward(params[0], test.images.data() + s * test.cols, rows, ews);
      right += net.correct(test.labels.data() + s, rows, ews);
    }
    accuracy = static_cast<double>(right) / static_cast<double>(test.size());
    const double loss =
        std::accumulate(losses.begin(), losses.end(), 0.0) / static_cast<double>(steps * o.batch);
    std::printf("epoch %d  train loss %.4f  test accuracy %.4f  %.0f samples/s\n", epoch, loss,
                accuracy, static_cast<double>(steps * o.batch) / seconds);
  }
  std::printf("done: test accuracy %.4f\n", accuracy);
  if (o.target >= 0 && accuracy < o.target) {
    std::fprintf(stderr, "train_mnist: test accuracy %.4f is below the target %.4f\n", accuracy,
                 o.target);
    return 1;
  }
  return 0;
}

}  // namespace mnist
