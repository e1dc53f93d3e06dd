// DataParallelTable over KVStore<device>: replicas on several devices, gradients summed on the
// primary's device, parameters broadcast from it.
#include <kvstore/compat/data_parallel.hpp>  // first: self-contained

#include "device_test_support.hpp"

#include <vector>

using dstore = kvstore::KVStore<kvstore::device, float>;
using table = kvstore::compat::DataParallelTable<dstore>;
using dtest::dev;
using dtest::on;

TEST_CASE("replicas on several devices: gradients summed into the primary, parameters broadcast" *
          doctest::timeout(60)) {
  dstore kv(
      kvstore::device_options{.devices = dtest::devices(), .placement = kvstore::placement::first});
  const std::size_t n = 1001;
  std::vector<kvstore::device_buffer<float>> p, g;
  for (int r = 0; r < 3; ++r) {
    std::vector<float> hp(n), hg(n);
    for (std::size_t i = 0; i < n; ++i) {
      hp[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
      hg[i] = static_cast<float>(r + 1) * 0.25f + static_cast<float>(i % 7);
    }
    p.push_back(on(dev(static_cast<std::size_t>(r)), hp));
    g.push_back(on(dev(static_cast<std::size_t>(r)), hg));
  }
  table t(kv);
  for (int r = 0; r < 3; ++r)
    t.add(p[static_cast<std::size_t>(r)].span(), g[static_cast<std::size_t>(r)].span());
  t.acc_grad_parameters();
  CHECK(t.needs_sync());
  const auto g0 = g[0].to_host();
  const auto g1 = g[1].to_host(), g2 = g[2].to_host();
  for (std::size_t i = 0; i < n; ++i) {
    const float base = static_cast<float>(i % 7);
    CHECK(g0[i] == (0.25f + base) + (0.5f + base) + (0.75f + base));
    CHECK(g1[i] == 0.f);  // zeroed on their own devices, as cunn does after its reduce
    CHECK(g2[i] == 0.f);
  }
  // Update the primary on the host (a stand-in for an optimizer step), then broadcast.
  auto w = p[0].to_host();
  for (std::size_t i = 0; i < n; ++i) w[i] -= 0.5f * g0[i];
  p[0].copy_from(w);
  t.sync_parameters();
  CHECK_FALSE(t.needs_sync());
  CHECK(p[1].to_host() == w);
  CHECK(p[2].to_host() == w);
}

TEST_CASE("a replica on a device the store does not have is refused" * doctest::timeout(60)) {
  dstore kv(kvstore::device_options{.devices = {dev(0)}});
  auto a = on(dev(0), std::vector<float>(4, 1.f));
  table t(kv);
  t.add(a.span(), a.span());
  kvstore::device_span<float> elsewhere{a.data(), 4, 77};
  CHECK_THROWS_AS(t.add(elsewhere, elsewhere), kvstore::error);
  CHECK(table::slice_range(10, 1, 3) == std::pair<std::size_t, std::size_t>{4, 3});
}
