#include <kvstore/reduce/cpu.hpp>  // first: the header is self-contained

#include <kvstore/engine/engine.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <vector>

namespace {

// Source s holds, at element i, a small integer that depends on both: every partial sum is an
// integer far below 2^24, so float and double sums are exact and any misplaced element shows.
template <class T>
T source_value(std::size_t s, std::size_t i) {
  return static_cast<T>(static_cast<long>((i * 7 + s * 131) % 1000) - 500 + static_cast<long>(s));
}

template <class T>
std::vector<std::vector<T>> make_sources(std::size_t k, std::size_t n) {
  std::vector<std::vector<T>> src(k, std::vector<T>(n));
  for (std::size_t s = 0; s < k; ++s)
    for (std::size_t i = 0; i < n; ++i) src[s][i] = source_value<T>(s, i);
  return src;
}

template <class T>
std::vector<std::span<const T>> spans(const std::vector<std::vector<T>>& v) {
  return {v.begin(), v.end()};
}

// Returns the number of wrong elements (0 when right), so a failure does not print a million
// lines.
template <class T>
std::size_t wrong(const std::vector<T>& dst, std::size_t k) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < dst.size(); ++i) {
    T want{};
    for (std::size_t s = 0; s < k; ++s) want += source_value<T>(s, i);
    if (dst[i] != want) ++bad;
  }
  return bad;
}

const std::size_t sizes[] = {0, 1, 15, 16, 17, 4095, 4096, 4097, (std::size_t{1} << 20) + 3};

}  // namespace

TEST_CASE_TEMPLATE("sum_into: 1..6 sources, odd sizes, exact" * doctest::timeout(60), T, float,
                   double) {
  for (std::size_t n : sizes) {
    for (std::size_t k = 1; k <= 6; ++k) {
      CAPTURE(n);
      CAPTURE(k);
      auto src = make_sources<T>(k, n);
      auto sp = spans(src);
      std::vector<T> dst(n, T{12345});
      kvstore::reduce::sum_into<T>(dst, sp);
      CHECK(wrong(dst, k) == 0);
    }
  }
}

TEST_CASE_TEMPLATE("sum_into: more sources than one fold (k = 7..11)" * doctest::timeout(60), T,
                   float, double) {
  const std::size_t n = 3 * 4096 + 5;
  for (std::size_t k = 7; k <= 11; ++k) {
    CAPTURE(k);
    auto src = make_sources<T>(k, n);
    auto sp = spans(src);
    std::vector<T> dst(n);
    kvstore::reduce::sum_into<T>(dst, sp);
    CHECK(wrong(dst, k) == 0);
  }
}

TEST_CASE("sum_into: no sources gives zeros" * doctest::timeout(60)) {
  std::vector<float> dst(100, 7.f);
  kvstore::reduce::sum_into<float>(dst, {});
  for (float x : dst) REQUIRE(x == 0.f);
}

TEST_CASE("sum_into: the order of the sum is left to right" * doctest::timeout(60)) {
  // 2^24 + 1 + 1 in float: left to right gives 2^24 (each +1 rounds away); any other grouping
  // (1 + 1 first) gives 2^24 + 2.
  const float big = 16777216.f;
  for (std::size_t k = 3; k <= 6; ++k) {
    CAPTURE(k);
    std::vector<std::vector<float>> src(k, std::vector<float>(37, 1.f));
    for (float& x : src[0]) x = big;
    auto sp = spans(src);
    std::vector<float> dst(37);
    kvstore::reduce::sum_into<float>(dst, sp);
    for (float x : dst) REQUIRE(x == big);
  }
}

TEST_CASE("sum_into: a size mismatch throws and leaves dst alone" * doctest::timeout(60)) {
  std::vector<double> a(10, 1.0), b(11, 2.0), dst(10, 5.0);
  std::vector<std::span<const double>> sp{a, b};
  try {
    kvstore::reduce::sum_into<double>(dst, sp);
    FAIL("no exception");
  } catch (const kvstore::error& e) {
    CHECK(e.code() == kvstore::errc::size_mismatch);
  }
  for (double x : dst) CHECK(x == 5.0);
}

TEST_CASE_TEMPLATE("sum_into on the engine: parallel path, exact" * doctest::timeout(60), T, float,
                   double) {
  kvstore::detail::engine eng(3);
  for (std::size_t n : {std::size_t{1000}, std::size_t{70000}, (std::size_t{1} << 20) + 3}) {
    for (std::size_t k = 1; k <= 6; ++k) {
      CAPTURE(n);
      CAPTURE(k);
      auto src = make_sources<T>(k, n);
      auto sp = spans(src);
      std::vector<T> dst(n, T{-1});
      kvstore::reduce::sum_into<T>(eng, dst, sp, 1 << 16);
      CHECK(wrong(dst, k) == 0);
      // parallel_min 0: even small sizes go through the pool's path.
      std::vector<T> dst2(n, T{-1});
      kvstore::reduce::sum_into<T>(eng, dst2, sp, 0);
      CHECK(wrong(dst2, k) == 0);
    }
  }
}

TEST_CASE("sum_into on the engine from inside a task" * doctest::timeout(60)) {
  kvstore::detail::engine eng(2);
  const std::size_t n = (std::size_t{1} << 18) + 1;
  auto src = make_sources<float>(3, n);
  auto sp = spans(src);
  std::vector<float> dst(n);
  auto st = std::make_shared<kvstore::detail::op_state>(1);
  eng.submit_sync(
      1, 0, [&] { kvstore::reduce::sum_into<float>(eng, dst, sp, 1024); }, st);
  kvstore::op(st).wait();
  CHECK(wrong(dst, 3) == 0);
}
