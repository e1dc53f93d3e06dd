// server/ranks.hpp: the per-worker bookkeeping of every key slice, checked against std::set and
// std::map doing the same random work, with ranks on both sides of each storage boundary (the
// numbers kept in the object and the ones on the heap; the first bitmap word and the others).
#include <kvstore/server/ranks.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

using kvstore::detail::rank_set;
using kvstore::detail::rank_values;

namespace {

// Mostly small ranks (a job's first workers), sometimes large ones.
int random_rank(std::mt19937_64& rng) {
  return rng() % 4 ? static_cast<int>(rng() % 4) : static_cast<int>(rng() % 200);
}

}  // namespace

TEST_CASE("rank_values: get, set, clear and for_each agree with a map" * doctest::timeout(60)) {
  std::mt19937_64 rng(7);
  rank_values v;
  std::map<int, std::uint64_t> ref;  // only ranks with a number
  for (int step = 0; step < 100'000; ++step) {
    const int r = random_rank(rng);
    const unsigned what = rng() % 10;
    if (what < 5) {
      const std::uint64_t x = rng() % 3 ? rng() % 1000 + 1 : 0;  // 0 clears the rank
      v.set(r, x);
      if (x)
        ref[r] = x;
      else
        ref.erase(r);
    } else if (what < 9) {
      const auto it = ref.find(r);
      REQUIRE(v.get(r) == (it == ref.end() ? 0 : it->second));
    } else if (rng() % 100 == 0) {
      v.clear();
      ref.clear();
    }
    if (step % 1000 == 0) {
      std::vector<std::pair<int, std::uint64_t>> seen;
      v.for_each([&](int rank, std::uint64_t x) { seen.emplace_back(rank, x); });
      REQUIRE(seen == std::vector<std::pair<int, std::uint64_t>>(ref.begin(), ref.end()));
    }
  }
  CHECK(v.get(-1) == 0);
  CHECK(v.get(100'000) == 0);
}

TEST_CASE("rank_values: the first ranks need no heap, and clearing keeps the numbers zero") {
  rank_values v;
  v.set(0, 5);
  v.set(1, 6);
  CHECK(v.get(0) == 5);
  CHECK(v.get(1) == 6);
  CHECK(v.get(2) == 0);
  v.set(70, 9);
  CHECK(v.get(70) == 9);
  CHECK(v.get(69) == 0);
  v.clear();
  for (int r : {0, 1, 2, 69, 70}) CHECK(v.get(r) == 0);
  int calls = 0;
  v.for_each([&](int, std::uint64_t) { ++calls; });
  CHECK(calls == 0);
}

TEST_CASE("rank_values and rank_set: a copy holds its own high ranks, a move takes them") {
  rank_values v;
  v.set(1, 4);
  v.set(90, 7);
  rank_values c = v;  // copied: the high ranks' words too, not shared
  v.set(90, 8);
  v.set(91, 2);
  CHECK(c.get(1) == 4);
  CHECK(c.get(90) == 7);
  CHECK(c.get(91) == 0);
  rank_values m = std::move(v);
  CHECK(m.get(90) == 8);
  CHECK(m.get(91) == 2);
  c = m;  // assigned over existing high ranks
  CHECK(c.get(91) == 2);

  rank_set a;
  a.insert(3);
  a.insert(130);
  rank_set b = a;
  a.insert(131);
  a.clear();
  CHECK(b.count(3) == 1);
  CHECK(b.count(130) == 1);
  CHECK(b.count(131) == 0);
  CHECK(b.size() == 2);
  CHECK(a.empty());
}

TEST_CASE("rank_set: count, insert, size, empty and for_each agree with a set" *
          doctest::timeout(60)) {
  std::mt19937_64 rng(9);
  rank_set s;
  std::set<int> ref;
  for (int step = 0; step < 100'000; ++step) {
    const int r = random_rank(rng);
    const unsigned what = rng() % 10;
    if (what < 4) {
      REQUIRE(s.insert(r) == ref.insert(r).second);
    } else if (what < 9) {
      REQUIRE(s.count(r) == ref.count(r));
    } else if (rng() % 50 == 0) {
      s.clear();
      ref.clear();
    }
    if (step % 1000 == 0) {
      REQUIRE(s.size() == ref.size());
      REQUIRE(s.empty() == ref.empty());
      std::vector<int> seen;
      s.for_each([&](int rank) { seen.push_back(rank); });
      REQUIRE(seen == std::vector<int>(ref.begin(), ref.end()));
    }
  }
  CHECK(s.count(-1) == 0);
}

TEST_CASE("rank_set: covers agrees with a rank-by-rank check" * doctest::timeout(60)) {
  // A sync round is complete once every worker pushed or left: round_done.covers(n, left).
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = static_cast<int>(rng() % 200);
    rank_set done, left;
    // Often nearly all ranks below n, so both answers come up, across word boundaries.
    for (int r = 0; r < n + 10; ++r) {
      const unsigned x = static_cast<unsigned>(rng() % 100);
      if (x < 70)
        done.insert(r);
      else if (x < 99 || rng() % 4)
        left.insert(r);
    }
    bool expect = true;
    for (int r = 0; r < n; ++r) expect = expect && (done.count(r) || left.count(r));
    REQUIRE(done.covers(n, left) == expect);
    REQUIRE(left.covers(n, done) == expect);
  }
  rank_set none;
  CHECK(none.covers(0, none));
  CHECK_FALSE(none.covers(1, none));
  rank_set first64;
  for (int r = 0; r < 64; ++r) first64.insert(r);
  CHECK(first64.covers(64, none));
  CHECK_FALSE(first64.covers(65, none));
  rank_set r64;
  r64.insert(64);
  CHECK(first64.covers(65, r64));
}
