// compat/mxnet.hpp's "device" store: <kvstore/device.hpp> comes before the layer, so
// create("device") builds a KVStore<device> over the visible devices (one virtual device on the
// OMP build). The same MXNet numbers as "local" (tests/support/mxnet_checks.hpp).
#include <kvstore/device.hpp>  // before the layer: it registers "device" only then

#include <kvstore/compat/mxnet.hpp>

#include "device_test_support.hpp"

#include "../support/mxnet_checks.hpp"

TEST_CASE("device: create(\"device\") is a device store" * doctest::timeout(60)) {
  auto kv = kvstore::compat::mxnet::KVStore::create("device");
  CHECK(kv.type() == "device");
  CHECK(kv.num_workers() == 1);
}

TEST_CASE("device: MXNet's default sgd steps by 0.01" * doctest::timeout(60)) {
  kvtest::mxnet::default_sgd_step("device");
}

TEST_CASE("device: ones pushed from 4 devices give 4" * doctest::timeout(60)) {
  kvtest::mxnet::four_devices_sum("device");
}

TEST_CASE("device: row_sparse_pull fills the asked rows, zeroes the others" *
          doctest::timeout(60)) {
  kvtest::mxnet::row_sparse_pull_rows("device");
}

TEST_CASE("device: optimizer states saved and loaded through the layer" * doctest::timeout(60)) {
  kvtest::mxnet::save_load_states("device");
}

TEST_CASE("device: dispose, then every call is an error; a second dispose does nothing" *
          doctest::timeout(60)) {
  kvtest::mxnet::dispose_then_calls_fail("device");
}
