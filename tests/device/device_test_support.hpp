// What the device tests share: their main (a CUDA build with no GPU visible exits with ctest's
// skip code 77 instead of failing), the devices they use (three virtual ones on the OMP build,
// up to three real ones on a CUDA build), exact or near comparison, and error checks.
#pragma once

#include <kvstore/device.hpp>

#include <doctest/doctest.h>

#include "../support/helpers.hpp"  // expect_error, vectors printed in failed checks

#include <cstdio>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace dtest {

inline bool cuda = kvstore::detail::rt::is_cuda;

/// The devices a test spreads over.
inline std::vector<int> devices() {
  if (!cuda) return {0, 1, 2};
  std::vector<int> d;
  for (int i = 0; i < kvstore::detail::rt::device_count() && i < 3; ++i) d.push_back(i);
  return d;
}
/// The i-th test device, wrapping around (one GPU: every "device" is 0).
inline int dev(std::size_t i) {
  auto d = devices();
  return d[i % d.size()];
}

template <class T>
kvstore::device_buffer<T> on(int d, const std::vector<T>& host) {
  return kvstore::device_buffer<T>(std::span<const T>(host), d);
}

/// Equal element for element: exactly on the OMP build (same arithmetic as the CPU), within a
/// few units in the last place on CUDA (nvcc contracts a*b+c into one rounding).
template <class T>
void same(const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!cuda) {
      if (got[i] != want[i]) {
        FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
        return;
      }
    } else if (!(got[i] == doctest::Approx(want[i]).epsilon(1e-5))) {
      FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
      return;
    }
  }
}

/// f must throw kvstore::error with `code` and a message containing every part.
using kvtest::expect_error;

}  // namespace dtest

int main(int argc, char** argv) {
  if (dtest::cuda && kvstore::detail::rt::device_count() == 0) {
    std::printf("no CUDA device visible: skipped\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
