// DataParallelTable over KVStore<local>: builds without Thrust or CUDA (the header must not pull
// them in), and does what cunn's DataParallelTable does, with host buffers.
#include <kvstore/compat/data_parallel.hpp>  // first: self-contained

#include <kvstore/local.hpp>

#include <doctest/doctest.h>

#include <span>
#include <vector>

#ifdef THRUST_VERSION
#error "compat/data_parallel.hpp must not include Thrust"
#endif

using table = kvstore::compat::DataParallelTable<kvstore::KVStore<kvstore::local, float>>;

TEST_CASE("slice_range splits as cunn does" * doctest::timeout(30)) {
  using p = std::pair<std::size_t, std::size_t>;
  CHECK(table::slice_range(10, 0, 3) == p{0, 4});
  CHECK(table::slice_range(10, 1, 3) == p{4, 3});
  CHECK(table::slice_range(10, 2, 3) == p{7, 3});
  CHECK(table::slice_range(2, 2, 3) == p{2, 0});
  CHECK(table::slice_range(9, 2, 3) == p{6, 3});
  CHECK_THROWS_AS(table::slice_range(10, 3, 3), kvstore::error);
  CHECK_THROWS_AS(table::slice_range(10, 0, 0), kvstore::error);
}

TEST_CASE("acc_grad_parameters sums into the primary; sync_parameters broadcasts" *
          doctest::timeout(30)) {
  kvstore::KVStore<kvstore::local, float> kv;
  std::vector<std::vector<float>> params(3, std::vector<float>(4)), grads(3, std::vector<float>(4));
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 4; ++i) {
      params[r][i] = static_cast<float>(r * 10 + i);
      grads[r][i] = static_cast<float>(r + 1) * 0.5f;
    }
  table t(kv);
  for (int r = 0; r < 3; ++r)
    CHECK(&t.add(std::span<float>(params[r]), std::span<float>(grads[r])) == &t);
  CHECK(t.size() == 3);
  CHECK_FALSE(t.needs_sync());
  t.acc_grad_parameters();
  CHECK(t.needs_sync());
  CHECK(grads[0] == std::vector<float>(4, 3.f));  // 0.5 + 1 + 1.5
  CHECK(grads[1] == std::vector<float>(4, 0.f));  // the others are zeroed, as cunn does
  CHECK(grads[2] == std::vector<float>(4, 0.f));
  for (auto& x : params[0]) x -= 1;  // the caller's update of the primary
  t.sync_parameters();
  CHECK_FALSE(t.needs_sync());
  for (int r = 0; r < 3; ++r) CHECK(params[r] == std::vector<float>{-1, 0, 1, 2});
  // Nothing new on the others: a second call leaves the primary's sum as it was.
  t.acc_grad_parameters();
  CHECK(grads[0] == std::vector<float>(4, 3.f));
}

TEST_CASE("passes accumulated between calls count once each: three are three times one" *
          doctest::timeout(30)) {
  // cunn issue #209: every replica adds each backward pass to its gradients (accGradParameters)
  // and the table reduces after each pass. Three passes without zeroing the primary must give
  // three times one pass's sum, 3 * (0.5 + 1 + 1.5); counting the others' old gradients again
  // gave 16.5.
  kvstore::KVStore<kvstore::local, float> kv;
  std::vector<std::vector<float>> params(3, std::vector<float>(5, 0.f)),
      grads(3, std::vector<float>(5, 0.f));
  table t(kv);
  for (int r = 0; r < 3; ++r) t.add(std::span<float>(params[r]), std::span<float>(grads[r]));
  for (int pass = 0; pass < 3; ++pass) {
    for (int r = 0; r < 3; ++r)
      for (float& g : grads[r]) g += static_cast<float>(r + 1) * 0.5f;
    t.acc_grad_parameters();
  }
  CHECK(grads[0] == std::vector<float>(5, 9.f));
  CHECK(grads[1] == std::vector<float>(5, 0.f));
  CHECK(grads[2] == std::vector<float>(5, 0.f));
}

TEST_CASE("misuse: mismatched sizes, no replicas; two tables in one store" * doctest::timeout(30)) {
  kvstore::KVStore<kvstore::local, float> kv;
  std::vector<float> p(4), g(4), p3(3), g3(3);
  table t(kv);
  CHECK_THROWS_AS(t.acc_grad_parameters(), kvstore::error);
  CHECK_THROWS_AS(t.sync_parameters(), kvstore::error);
  CHECK_THROWS_AS(t.add(std::span<float>(p), std::span<float>(g3)), kvstore::error);
  t.add(std::span<float>(p), std::span<float>(g));
  try {
    t.add(std::span<float>(p3), std::span<float>(g3));
    FAIL("no error");
  } catch (const kvstore::error& e) {
    CHECK(e.code() == kvstore::errc::size_mismatch);
  }
  CHECK(t.size() == 1);
  table t2(kv);  // its own keys
  t2.add(std::span<float>(p3), std::span<float>(g3));
  t2.acc_grad_parameters();
}
