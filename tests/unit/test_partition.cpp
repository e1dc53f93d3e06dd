// Which server holds which elements of a key, without sockets: every worker must compute the same
// layout from the key's id, size and row length alone. A small value lives whole on its home
// server (a hash of the key); a big one is cut into contiguous slices, whole rows for a matrix,
// at most one per server, evenly, starting at the home server and rotating from there.
#include <kvstore/client/partition.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <vector>

using kvstore::detail::partition;
using kvstore::detail::slice_ref;

namespace {

constexpr std::size_t mib = 1 << 20;

int home_of(std::uint64_t key, int servers) {
  return static_cast<int>(kvstore::detail::mix64(key) % static_cast<std::uint64_t>(servers));
}

// The slices cover [0, total) in order without gaps or overlaps, each on a distinct valid server,
// each a whole number of `unit` elements.
void check_layout(const std::vector<slice_ref>& s, std::uint64_t total, std::uint64_t unit,
                  int servers) {
  REQUIRE_FALSE(s.empty());
  CHECK(s.front().lo == 0);
  CHECK(s.back().hi == total);
  std::set<int> used;
  for (std::size_t i = 0; i < s.size(); ++i) {
    CAPTURE(i);
    CHECK(s[i].lo < s[i].hi);
    if (i) CHECK(s[i].lo == s[i - 1].hi);
    CHECK(s[i].lo % unit == 0);
    CHECK(s[i].server >= 0);
    CHECK(s[i].server < servers);
    CHECK(used.insert(s[i].server).second);
  }
}

}  // namespace

TEST_CASE("one server holds every key whole") {
  for (std::uint64_t total : {1ull, 1000ull, 100ull * mib}) {
    const auto s = partition(7, total, 0, 4, 1, mib);
    REQUIRE(s.size() == 1);
    CHECK(s[0].server == 0);
    CHECK(s[0].lo == 0);
    CHECK(s[0].hi == total);
  }
}

TEST_CASE("a small value lives whole on its home server; keys spread over all servers") {
  std::set<int> homes;
  for (std::uint64_t key = 0; key < 200; ++key) {
    const auto s = partition(key, 1000, 0, 4, 4, mib);  // 4 KB: below slice_bytes
    REQUIRE(s.size() == 1);
    CHECK(s[0].server == home_of(key, 4));
    CHECK(s[0].lo == 0);
    CHECK(s[0].hi == 1000);
    homes.insert(s[0].server);
  }
  CHECK(homes.size() == 4);
}

TEST_CASE("exactly slice_bytes stays whole; one element more is sliced over every server") {
  const std::uint64_t n = mib / 4;  // floats: exactly 1 MiB
  CHECK(partition(3, n, 0, 4, 3, mib).size() == 1);
  const auto s = partition(3, n + 1, 0, 4, 3, mib);
  CHECK(s.size() == 3);
  check_layout(s, n + 1, 1, 3);
}

TEST_CASE("a big value is cut evenly, the first slice on the home server, then rotating") {
  for (int servers : {2, 3, 5, 8}) {
    for (std::uint64_t key : {0ull, 1ull, 99ull, 0xdeadbeefull}) {
      CAPTURE(servers);
      CAPTURE(key);
      const std::uint64_t total = 1'000'003;  // not a multiple of the server count
      const auto s = partition(key, total, 0, 4, servers, mib);
      REQUIRE(s.size() == static_cast<std::size_t>(servers));
      check_layout(s, total, 1, servers);
      const int home = home_of(key, servers);
      for (std::size_t i = 0; i < s.size(); ++i) {
        CHECK(s[i].server == (home + static_cast<int>(i)) % servers);
        const std::uint64_t len = s[i].hi - s[i].lo;
        CHECK(len >= total / static_cast<std::uint64_t>(servers));
        CHECK(len <= total / static_cast<std::uint64_t>(servers) + 1);
      }
    }
  }
}

TEST_CASE("a matrix is cut at whole rows") {
  const std::uint64_t rows = 1001, len = 300;  // 1.2 MB of floats
  const auto s = partition(42, rows * len, len, 4, 4, mib);
  REQUIRE(s.size() == 4);
  check_layout(s, rows * len, len, 4);
  for (const auto& x : s) {
    CHECK((x.hi - x.lo) / len >= rows / 4);
    CHECK((x.hi - x.lo) / len <= rows / 4 + 1);
  }
}

TEST_CASE("fewer rows than servers: one slice per row; a single row is never split") {
  const std::uint64_t len = 200'000;  // one row is 800 KB
  const auto three = partition(5, 3 * len, len, 4, 5, mib);
  REQUIRE(three.size() == 3);
  check_layout(three, 3 * len, len, 5);
  for (const auto& x : three) CHECK(x.hi - x.lo == len);

  const auto one = partition(5, 2 * mib, 2 * mib, 4, 5, mib);  // one 8 MB row
  REQUIRE(one.size() == 1);
  CHECK(one[0].server == home_of(5, 5));
  CHECK(one[0].hi == 2 * mib);
}

TEST_CASE("the layout depends only on its inputs: every worker computes the same") {
  const auto a = partition(1234, 5'000'000, 0, 8, 6, mib);
  const auto b = partition(1234, 5'000'000, 0, 8, 6, mib);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].server == b[i].server);
    CHECK(a[i].lo == b[i].lo);
    CHECK(a[i].hi == b[i].hi);
  }
  CHECK(kvstore::detail::mix64(1) == kvstore::detail::mix64(1));
  CHECK(kvstore::detail::mix64(1) != kvstore::detail::mix64(2));
}

TEST_CASE("partition::even: BigDL's chunks, chunk i on server i whatever the size") {
  using kvstore::detail::even_chunk;
  using kvstore::detail::partition_even;
  // 10 over 3: (0, 4), (4, 3), (7, 3); 2 over 4: (0, 1), (1, 1), (2, 0), (2, 0).
  const std::uint64_t want10[3][2] = {{0, 4}, {4, 3}, {7, 3}};
  for (std::uint64_t i = 0; i < 3; ++i) {
    CHECK(even_chunk(i, 3, 10).start == want10[i][0]);
    CHECK(even_chunk(i, 3, 10).length == want10[i][1]);
  }
  const std::uint64_t want2[4][2] = {{0, 1}, {1, 1}, {2, 0}, {2, 0}};
  for (std::uint64_t i = 0; i < 4; ++i) {
    CHECK(even_chunk(i, 4, 2).start == want2[i][0]);
    CHECK(even_chunk(i, 4, 2).length == want2[i][1]);
  }
  auto s = partition_even(10, 0, 3);
  REQUIRE(s.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(s[static_cast<std::size_t>(i)].server == i);
    CHECK(s[static_cast<std::size_t>(i)].lo == want10[i][0]);
    CHECK(s[static_cast<std::size_t>(i)].hi == want10[i][0] + want10[i][1]);
  }
  check_layout(s, 10, 1, 3);
  // Empty chunks get no slice: 2 elements over 4 servers live on servers 0 and 1.
  auto t = partition_even(2, 0, 4);
  REQUIRE(t.size() == 2);
  CHECK(t[0].server == 0);
  CHECK(t[1].server == 1);
  check_layout(t, 2, 1, 4);
  // A matrix is cut by whole rows: 5 rows of 3 over 2 servers are rows [0, 3) and [3, 5).
  auto m = partition_even(15, 3, 2);
  REQUIRE(m.size() == 2);
  CHECK(m[0].hi == 9);
  CHECK(m[1].lo == 9);
  check_layout(m, 15, 3, 2);
  // However small, a key is spread: 1 element over 1 server, 7 over 7 servers one each.
  CHECK(partition_even(1, 0, 1).size() == 1);
  CHECK(partition_even(7, 0, 7).size() == 7);
}
