// server/coverage.hpp: which elements of a slice a sync round has written, checked against a
// bitmap doing the same random work: what each contribution copies and what it adds, overlap
// tests, the merged ranges, a whole value, and clearing. Ranges are often apart from each other,
// so the rare case (several ranges, kept apart from the slice) runs as much as the common one.
#include <kvstore/server/coverage.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

using kvstore::detail::coverage;

namespace {

constexpr std::uint64_t n = 64;  // elements of the slice

// The written elements as runs [b, e), as for_each gives them.
std::vector<std::pair<std::uint64_t, std::uint64_t>> runs_of(const std::vector<bool>& written) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
  for (std::uint64_t i = 0; i < n;) {
    if (!written[i]) {
      ++i;
      continue;
    }
    std::uint64_t e = i;
    while (e < n && written[e]) ++e;
    runs.emplace_back(i, e);
    i = e;
  }
  return runs;
}

}  // namespace

TEST_CASE("coverage: contribute, disjoint, for_each, whole and clear agree with a bitmap" *
          doctest::timeout(60)) {
  std::mt19937_64 rng(11);
  coverage cov;
  std::vector<bool> written(n, false);
  for (int step = 0; step < 100'000; ++step) {
    const unsigned what = rng() % 20;
    std::uint64_t a = rng() % (n + 1), b = rng() % (n + 1);
    if (a > b) std::swap(a, b);
    if (a == b) {  // non-empty ranges (an empty one has its own case below)
      if (b < n)
        ++b;
      else
        --a;
    }
    if (what == 0) {
      cov.clear();
      written.assign(n, false);
    } else if (what < 12) {
      // Each element of [a, b) is copied once if unwritten, added once if written, in order.
      std::vector<int> seen(n, 0);  // 1 copied, 2 added
      std::uint64_t last = a;
      auto visit = [&](int kind) {
        return [&, kind](std::uint64_t x, std::uint64_t y) {
          REQUIRE(x < y);
          REQUIRE(x >= last);
          last = y;
          for (std::uint64_t i = x; i < y; ++i) {
            REQUIRE(seen[i] == 0);
            seen[i] = kind;
          }
        };
      };
      cov.contribute(a, b, visit(1), visit(2));
      for (std::uint64_t i = 0; i < n; ++i) {
        if (i < a || i >= b) {
          REQUIRE(seen[i] == 0);
          continue;
        }
        REQUIRE(seen[i] == (written[i] ? 2 : 1));
        written[i] = true;
      }
    } else {
      bool none = true;
      for (std::uint64_t i = a; i < b; ++i) none = none && !written[i];
      REQUIRE(cov.disjoint(a, b) == none);
    }
    std::vector<std::pair<std::uint64_t, std::uint64_t>> got;
    cov.for_each([&](std::uint64_t x, std::uint64_t y) { got.emplace_back(x, y); });
    const auto want = runs_of(written);
    REQUIRE(got == want);
    // whole() may miss a whole value made of several ranges merged (it only saves a copy), but
    // never says whole when it is not.
    if (cov.whole(n)) REQUIRE(want == decltype(want){{0, n}});
    REQUIRE(cov.empty() == got.empty());
  }
}

TEST_CASE("coverage: a move keeps the ranges, several of them too" * doctest::timeout(10)) {
  coverage cov;
  auto none = [](std::uint64_t, std::uint64_t) {};
  cov.contribute(0, 4, none, none);
  cov.contribute(10, 12, none, none);  // apart: now several ranges
  coverage moved = std::move(cov);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> got;
  moved.for_each([&](std::uint64_t x, std::uint64_t y) { got.emplace_back(x, y); });
  REQUIRE(got == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0, 4}, {10, 12}});
  REQUIRE_FALSE(moved.disjoint(11, 20));
  REQUIRE(moved.disjoint(4, 10));
  moved.clear();
  REQUIRE(moved.empty());
  REQUIRE(moved.disjoint(0, 64));
}

TEST_CASE("coverage: an empty contribution copies and adds nothing" * doctest::timeout(10)) {
  coverage cov;
  int calls = 0;
  auto count = [&](std::uint64_t, std::uint64_t) { ++calls; };
  cov.contribute(0, 4, count, count);
  cov.contribute(20, 20, count, count);  // apart from the one range: still one range
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  cov.for_each([&](std::uint64_t x, std::uint64_t y) { ranges.emplace_back(x, y); });
  REQUIRE(ranges == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0, 4}});
  cov.contribute(10, 12, count, count);  // several ranges
  REQUIRE(calls == 2);
  cov.contribute(11, 11, count, count);
  cov.contribute(20, 20, count, count);
  REQUIRE(calls == 2);
  // A range over the empty ones: one copy each side of the written [10, 12), one add.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> copies, adds;
  cov.contribute(
      8, 24, [&](std::uint64_t x, std::uint64_t y) { copies.emplace_back(x, y); },
      [&](std::uint64_t x, std::uint64_t y) { adds.emplace_back(x, y); });
  REQUIRE(copies == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{8, 10}, {12, 24}});
  REQUIRE(adds == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{10, 12}});
}

TEST_CASE("coverage: mark_whole is a whole-value contribute whose copy the caller did" *
          doctest::timeout(60)) {
  coverage marked, contributed;
  marked.mark_whole(n);
  contributed.contribute(
      0, n, [](auto, auto) {}, [](auto, auto) {});
  CHECK(marked.whole(n));
  CHECK_FALSE(marked.empty());
  CHECK_FALSE(marked.disjoint(n - 1, n));
  std::vector<std::pair<std::uint64_t, std::uint64_t>> seen;
  marked.for_each([&](std::uint64_t b, std::uint64_t e) { seen.emplace_back(b, e); });
  CHECK(seen == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0, n}});
  // What the next pushes do is the same after either: a part adds, the rest past n copies.
  for (coverage* c : {&marked, &contributed}) {
    std::uint64_t added = 0, copied = 0;
    c->contribute(
        n / 2, n + 8, [&](auto b, auto e) { copied += e - b; },
        [&](auto b, auto e) { added += e - b; });
    CHECK(added == n / 2);
    CHECK(copied == 8);
    CHECK(c->whole(n + 8));
  }
  marked.clear();
  CHECK(marked.empty());
}
