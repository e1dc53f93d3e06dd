// compat/mxnet.hpp over the local store, and create()'s answers to names it cannot serve. This
// program does not include <kvstore/device.hpp>, so "device" must be refused with a clear error.
#include <kvstore/compat/mxnet.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/helpers.hpp"
#include "support/mxnet_checks.hpp"

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

using kvstore::errc;
using kvstore::compat::mxnet::KVStore;
using kvtest::expect_error;

TEST_CASE("local: MXNet's default sgd steps by 0.01" * doctest::timeout(30)) {
  kvtest::mxnet::default_sgd_step("local");
}

TEST_CASE("local: ones pushed from 4 devices give 4" * doctest::timeout(30)) {
  kvtest::mxnet::four_devices_sum("local");
}

TEST_CASE("local: row_sparse_pull fills the asked rows, zeroes the others" * doctest::timeout(30)) {
  kvtest::mxnet::row_sparse_pull_rows("local");
}

TEST_CASE("local: optimizer states saved and loaded through the layer" * doctest::timeout(30)) {
  kvtest::mxnet::save_load_states("local");
}

TEST_CASE("local: dispose, then every call is an error; a second dispose does nothing" *
          doctest::timeout(30)) {
  kvtest::mxnet::dispose_then_calls_fail("local");
  // A moved-from store is as disposed.
  auto a = KVStore::create();
  auto b = std::move(a);
  CHECK(b.type() == "local");
  expect_error([&] { (void)a.rank(); }, errc::shutdown, {"rank"});
}

TEST_CASE("local: several keys in one call, as MXNet's lists" * doctest::timeout(30)) {
  auto kv = KVStore::create("local");
  const std::vector<kvstore::key> ks{5, 7, "fc1.w"};
  const std::vector<float> ones(6, 1.0f), twos(6, 2.0f);
  const std::vector<std::span<const float>> init_vs(3, ones), push_vs(3, twos);
  kv.init(ks, init_vs);
  kv.push(ks, push_vs);
  std::vector<float> a(6), b(6), c(6);
  const std::vector<std::span<float>> outs{a, b, c};
  kv.pull(ks, outs).wait();
  CHECK(a == twos);
  CHECK(b == twos);
  CHECK(c == twos);
}

TEST_CASE("local: the cluster calls of a store with no cluster" * doctest::timeout(30)) {
  auto kv = KVStore::create("local");
  kv.barrier();
  kv.set_barrier_before_exit(false);
  CHECK(kv.num_dead_node(6) == 0);
  kv.send_command_to_servers(0, "lr=0.1");  // no servers: nothing to do, as in MXNet
  CHECK(kv.type() == "local");
}

TEST_CASE("row_sparse_pull: bad arguments are errors naming the call and key" *
          doctest::timeout(30)) {
  auto kv = KVStore::create("local");
  kv.init("dense", std::vector<float>(6, 1.0f));
  kv.init("rows", std::vector<float>(6, 1.0f), 2);  // 3 rows of 2
  std::vector<float> out(6, 5.0f);
  expect_error([&] { kv.row_sparse_pull("nope", out, {0}); }, errc::unknown_key,
               {"row_sparse_pull", "nope"});
  expect_error([&] { kv.row_sparse_pull("dense", out, {0}); }, errc::not_a_matrix,
               {"row_sparse_pull", "dense", "row_length"});
  std::vector<float> small(4);
  expect_error([&] { kv.row_sparse_pull("rows", small, {0}); }, errc::size_mismatch,
               {"row_sparse_pull", "rows", "6"});
  expect_error(
      [&] {
        kv.row_sparse_pull("rows", out, {1, 3});
      },
      errc::row_out_of_range, {"row_sparse_pull", "rows", "row 3"});
  expect_error([&] { kv.row_sparse_pull("rows", out, {-1}); }, errc::row_out_of_range, {"row -1"});
  CHECK(out == std::vector<float>(6, 5.0f));  // a refused call leaves out alone
  kv.row_sparse_pull("rows", out, std::span<const std::int64_t>{}).wait();  // no rows: zeros
  CHECK(out == std::vector<float>(6, 0.0f));
  expect_error([&] { kv.init("odd", std::vector<float>(5, 1.0f), 2); }, errc::size_mismatch,
               {"odd"});
}

TEST_CASE("create reads names as MXNet's KVStore::Create: any case, local, device or dist in them" *
          doctest::timeout(30)) {
  for (const char* n : {"local", "LOCAL", "Local_AllReduce_CPU", "local_update_cpu"}) {
    auto kv = KVStore::create(n);
    std::string lower(n);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    CHECK(kv.type() == lower);  // MXNet's type is the lower-cased name
    kv.init(1, std::vector<float>(2, 1.0f));
    std::vector<float> out(2);
    kv.pull(1, out).wait();
    CHECK(out == std::vector<float>(2, 1.0f));
  }
  // A name with none of the words is refused (MXNet would make a local store of a typo).
  expect_error([] { (void)KVStore::create("lcoal"); }, errc::invalid_argument,
               {"lcoal", "local", "device", "dist", "dist_sync", "dist_async"});
}

TEST_CASE("create of a device name without <kvstore/device.hpp> says so" * doctest::timeout(30)) {
  for (const char* n : {"device", "local_allreduce_device", "NCCL"})
    expect_error([n] { (void)KVStore::create(n); }, errc::unsupported,
                 {n, "#include <kvstore/device.hpp>"});
}

TEST_CASE("create: a dist name that KVSTORE_TYPE contradicts is refused before connecting" *
          doctest::timeout(30)) {
  const char* saved = std::getenv("KVSTORE_TYPE");
  const std::string keep = saved ? saved : "";
  ::setenv("KVSTORE_TYPE", "dist_sync", 1);
  expect_error([] { (void)KVStore::create("dist_async"); }, errc::invalid_argument,
               {"dist_async", "KVSTORE_TYPE=dist_sync"});
  expect_error([] { (void)KVStore::create("Dist_Async"); }, errc::invalid_argument,
               {"dist_async", "KVSTORE_TYPE=dist_sync"});
  ::setenv("KVSTORE_TYPE", "dist_async", 1);
  expect_error([] { (void)KVStore::create("dist"); }, errc::invalid_argument,
               {"\"dist\"", "KVSTORE_TYPE=dist_async"});
  // Any other name with "dist" in it is dist_sync, as MXNet's (only "_async" makes it async).
  for (const char* n : {"dist_sync", "dist_device_sync", "DIST_SYNC_DEVICE"})
    expect_error([n] { (void)KVStore::create(n); }, errc::invalid_argument,
                 {"KVSTORE_TYPE=dist_async"});
  if (saved)
    ::setenv("KVSTORE_TYPE", keep.c_str(), 1);
  else
    ::unsetenv("KVSTORE_TYPE");
}

TEST_CASE(
    "set_gradient_compression: refused on local as MXNet does; MXNet's parameters are checked, "
    "each error naming the call and the parameter" *
    doctest::timeout(30)) {
  auto kv = KVStore::create("local");
  expect_error(
      [&] {
        kv.set_gradient_compression({{"type", "2bit"}, {"threshold", "0.5"}});
      },
      errc::unsupported, {"set_gradient_compression", "local"});
  expect_error([&] { kv.set_gradient_compression({.type = kvstore::compression::fp16}); },
               errc::unsupported, {"set_gradient_compression", "local"});
  expect_error(
      [&] {
        kv.set_gradient_compression({{"type", "3bit"}});
      },
      errc::invalid_argument, {"set_gradient_compression", "type \"3bit\"", "2bit"});
  expect_error(
      [&] {
        kv.set_gradient_compression({{"threshold", "0.5"}});
      },
      errc::invalid_argument, {"set_gradient_compression", "no \"type\""});
  for (const char* th : {"0", "-1", "abc", "0.5x", "inf", ""})
    expect_error(
        [&] {
          kv.set_gradient_compression({{"type", "2bit"}, {"threshold", th}});
        },
        errc::invalid_argument,
        {"set_gradient_compression", "threshold \"" + std::string(th) + "\""});
  expect_error(
      [&] {
        kv.set_gradient_compression({{"type", "2bit"}, {"thresold", "0.5"}});
      },
      errc::invalid_argument, {"set_gradient_compression", "unknown parameter \"thresold\""});
  kv.dispose();
  expect_error(
      [&] {
        kv.set_gradient_compression({{"type", "2bit"}});
      },
      errc::shutdown, {"set_gradient_compression"});
}
