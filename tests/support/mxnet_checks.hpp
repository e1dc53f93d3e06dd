// The MXNet layer's checks that hold for every single-process store ("local", "device"): each
// makes its own store with compat::mxnet::KVStore::create(type) and checks MXNet's numbers.
// Include after <doctest/doctest.h> and <kvstore/compat/mxnet.hpp>.
#pragma once

#include <kvstore/compat/mxnet.hpp>

#include "helpers.hpp"

#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtest::mxnet {

using kvstore::compat::mxnet::KVStore;

inline std::vector<float> pulled(KVStore& kv, kvstore::key k, std::size_t n) {
  std::vector<float> out(n, -999.0f);
  kv.pull(k, out).wait();
  return out;
}

/// init zeros(2x2), set MXNet's default sgd (learning rate 0.01), push ones: -0.01 everywhere.
inline void default_sgd_step(std::string_view type) {
  auto kv = KVStore::create(type);
  CHECK(kv.type() == type);
  CHECK(kv.rank() == 0);
  CHECK(kv.num_workers() == 1);
  kv.init(3, std::vector<float>(4, 0.0f));
  kv.set_optimizer(kvstore::optim::sgd{});
  const std::vector<float> ones(4, 1.0f);  // alive until the push is done (MPI's rule)
  kv.push(3, ones);
  CHECK(pulled(kv, 3, 4) == std::vector<float>(4, -0.01f));
}

/// Ones pushed from 4 devices are summed: 4. Pulled into 2 devices' outputs, each gets 4.
inline void four_devices_sum(std::string_view type) {
  auto kv = KVStore::create(type);
  const std::vector<float> ones(4, 1.0f);
  kv.init("w", std::vector<float>(4, 0.0f));
  kv.push("w", {ones, ones, ones, ones});
  CHECK(pulled(kv, "w", 4) == std::vector<float>(4, 4.0f));

  // The multi-key form with the key listed once per device is the same push.
  const std::vector<kvstore::key> ks(4, "w");
  const std::vector<float> twos(4, 2.0f);
  const std::vector<std::span<const float>> vs(4, twos);
  kv.push(ks, vs);
  std::vector<float> a(4), b(4);
  kv.pull("w", {a, b}).wait();
  CHECK(a == std::vector<float>(4, 8.0f));
  CHECK(b == std::vector<float>(4, 8.0f));
}

/// row_sparse_pull of rows {0, 2} of ones(3x3): rows 0 and 2 ones, row 1 zeros (whatever out
/// held); rows {2, 0, 2} are deduplicated to the same answer.
inline void row_sparse_pull_rows(std::string_view type) {
  auto kv = KVStore::create(type);
  kv.init("embed", std::vector<float>(9, 1.0f), /*row_length=*/3);
  const std::vector<float> want{1, 1, 1, 0, 0, 0, 1, 1, 1};
  std::vector<float> out(9, 7.0f);
  kv.row_sparse_pull("embed", out, {0, 2}).wait();
  CHECK(out == want);
  std::fill(out.begin(), out.end(), 7.0f);
  const std::vector<std::int64_t> repeated{2, 0, 2};
  kv.row_sparse_pull("embed", out, repeated).wait();
  CHECK(out == want);
  // Rows follow pushes on the key, in order.
  const std::vector<float> nine{1, 2, 3, 4, 5, 6, 7, 8, 9};
  kv.push("embed", nine);
  kv.row_sparse_pull("embed", out, {1}).wait();
  CHECK(out == std::vector<float>{0, 0, 0, 4, 5, 6, 0, 0, 0});
}

/// Momentum saved by one store and loaded by another continues the same trajectory; without the
/// load the second store's step differs.
inline void save_load_states(std::string_view type) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("kvstore_test_mxnet_" + std::string(type) + "_" + std::to_string(::getpid()));
  const kvstore::optim::sgd opt{.learning_rate = 0.1, .momentum = 0.9};
  const std::vector<float> w0{1, 2, 3, 4}, g{1, 1, 1, 1};

  auto a = KVStore::create(type);
  a.init("w", w0);
  a.set_optimizer(opt);
  a.push("w", g);
  const auto after_one = pulled(a, "w", 4);
  a.save_optimizer_states(path);
  a.push("w", g);
  const auto want = pulled(a, "w", 4);
  a.dispose();

  auto b = KVStore::create(type);
  b.init("w", after_one);
  b.set_optimizer(opt);
  b.load_optimizer_states(path);
  b.push("w", g);
  CHECK(pulled(b, "w", 4) == want);

  auto fresh = KVStore::create(type);
  fresh.init("w", after_one);
  fresh.set_optimizer(opt);
  fresh.push("w", g);
  CHECK(pulled(fresh, "w", 4) != want);
  std::filesystem::remove(path);
}

/// After dispose() every call is an error naming it; a second dispose() does nothing.
inline void dispose_then_calls_fail(std::string_view type) {
  auto kv = KVStore::create(type);
  kv.init(1, std::vector<float>(2, 0.0f));
  kv.dispose();
  const std::vector<float> v(2, 1.0f);
  kvtest::expect_error([&] { kv.push(1, v); }, kvstore::errc::shutdown, {"push", "disposed"});
  kvtest::expect_error([&] { (void)kv.type(); }, kvstore::errc::shutdown, {"type", "disposed"});
  kvtest::expect_error([&] { kv.barrier(); }, kvstore::errc::shutdown, {"barrier", "disposed"});
  kv.dispose();
}

}  // namespace kvtest::mxnet
