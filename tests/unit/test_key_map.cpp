// detail/flat_index.hpp and detail/key_map.hpp: the flat per-key tables of workers and servers,
// checked against std::unordered_map doing the same random work, with ids that collide on
// purpose (probe runs that wrap, erases in the middle of a run).
#include <kvstore/detail/key_map.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

using kvstore::detail::flat_index;
using kvstore::detail::key_map;

namespace {

// Ids from a small range (many share home slots) mixed with FNV-style ids (top bit set), as
// named and integer keys are.
std::uint64_t random_id(std::mt19937_64& rng) {
  const std::uint64_t r = rng();
  return (r & 1) ? (r >> 1) % 300 : (r | (1ull << 63));
}

}  // namespace

TEST_CASE("flat_index: find, insert and erase agree with unordered_map" * doctest::timeout(60)) {
  std::mt19937_64 rng(12);
  std::vector<int> objects(400);
  flat_index<int> idx;
  std::unordered_map<std::uint64_t, int*> ref;
  std::vector<std::uint64_t> seen;
  for (int step = 0; step < 200'000; ++step) {
    const std::uint64_t id =
        (!seen.empty() && rng() % 2) ? seen[rng() % seen.size()] : random_id(rng);
    const unsigned what = rng() % 3;
    if (what == 0) {
      int* v = &objects[rng() % objects.size()];
      int* now = idx.insert(id, v);
      auto [it, added] = ref.try_emplace(id, v);
      REQUIRE(now == it->second);  // a taken id keeps its object
      if (added) seen.push_back(id);
    } else if (what == 1) {
      auto it = ref.find(id);
      REQUIRE(idx.erase(id) == (it == ref.end() ? nullptr : it->second));
      if (it != ref.end()) ref.erase(it);
    } else {
      auto it = ref.find(id);
      REQUIRE(idx.find(id) == (it == ref.end() ? nullptr : it->second));
    }
    REQUIRE(idx.size() == ref.size());
  }
  // Every id the reference holds is still found after all the shifting erases.
  for (auto& [id, v] : ref) CHECK(idx.find(id) == v);
  idx.clear();
  CHECK(idx.size() == 0);
  CHECK(idx.find(ref.empty() ? 1 : ref.begin()->first) == nullptr);
}

TEST_CASE("flat_index: an empty table finds nothing, erases nothing, prefetches safely") {
  flat_index<int> idx;
  CHECK(idx.find(0) == nullptr);
  CHECK(idx.erase(0) == nullptr);
  idx.prefetch(7);
  int x = 1;
  idx.reserve(1000);
  CHECK(idx.insert(0, &x) == &x);  // id 0 is an id like any other
  CHECK(idx.find(0) == &x);
  CHECK(idx.find(1) == nullptr);
}

TEST_CASE("key_map: values never move, iteration visits each once, erase keeps the rest") {
  key_map<std::string> m;
  std::vector<std::string*> where;
  for (std::uint64_t i = 0; i < 5000; ++i) {
    auto [it, fresh] = m.try_emplace(i * 7);
    REQUIRE(fresh);
    it->second = std::to_string(i);
    where.push_back(&it->second);
  }
  // Growing the index and the node list moved no value.
  for (std::uint64_t i = 0; i < 5000; ++i) REQUIRE(&m.at(i * 7) == where[i]);
  auto [again, fresh] = m.try_emplace(14);
  CHECK_FALSE(fresh);
  CHECK(again->second == "2");
  CHECK(m.count(14) == 1);
  CHECK(m.count(15) == 0);
  CHECK(m.find(15) == m.end());
  CHECK_THROWS_AS(m.at(15), std::out_of_range);

  for (std::uint64_t i = 0; i < 5000; i += 3) REQUIRE(m.erase(i * 7) == 1);
  CHECK(m.erase(0) == 0);
  std::set<std::uint64_t> visited;
  for (auto& [id, v] : m) {
    REQUIRE(id % 7 == 0);
    REQUIRE((id / 7) % 3 != 0);
    REQUIRE(v == std::to_string(id / 7));
    REQUIRE(&v == where[id / 7]);  // erasing others moved no value either
    visited.insert(id);
  }
  CHECK(visited.size() == m.size());
  CHECK(m.size() == 5000 - 1667);
  // find_value: the value itself, where find() gives an iterator to it; nullptr once erased.
  for (std::uint64_t i = 0; i < 5000; ++i) {
    std::string* v = m.find_value(i * 7);
    if (i % 3 == 0) {
      REQUIRE(v == nullptr);
    } else {
      REQUIRE(v == where[i]);
      REQUIRE(v == &m.find(i * 7)->second);
    }
  }
  CHECK(m.find_value(15) == nullptr);
  m[3] = "three";
  CHECK(m.at(3) == "three");
  const auto& cm = m;
  CHECK(cm.find(3)->second == "three");
  const std::string* c3 = cm.find_value(3);
  REQUIRE(c3 != nullptr);
  CHECK(*c3 == "three");
  CHECK(cm.find_value(4) == nullptr);
  m.clear();
  CHECK(m.empty());
  CHECK(m.begin() == m.end());
}

TEST_CASE("key_map: a million keys go in and are found in linear time" * doctest::timeout(60)) {
  // Growing by a constant step instead of doubling (the index or the node list) would make
  // this quadratic: hours instead of well under a second.
  key_map<std::uint64_t> m;
  for (std::uint64_t i = 0; i < 1'000'000; ++i) m[i * 3 + 1] = i;
  std::uint64_t sum = 0;
  for (std::uint64_t i = 0; i < 1'000'000; ++i) sum += m.find(i * 3 + 1)->second;
  CHECK(sum == 999'999ull * 1'000'000ull / 2);
  CHECK(m.find(0) == m.end());
}

TEST_CASE("key_map: frees() changes whenever a value may have been freed, and only then") {
  key_map<int> m;
  const std::uint64_t start = m.frees();
  m[1] = 1;
  m[2] = 2;
  for (int k = 3; k < 100; ++k) m[k] = k;  // growing moves no value
  CHECK(m.frees() == start);
  CHECK(m.erase(1000) == 0);
  CHECK(m.frees() == start);
  CHECK(m.erase(1) == 1);
  const std::uint64_t after_erase = m.frees();
  CHECK(after_erase != start);
  key_map<int> other;
  other[7] = 7;
  key_map<int> moved(std::move(m));  // m's values now belong to `moved`: m freed them
  CHECK(moved.frees() == after_erase);
  CHECK(m.empty());
  CHECK(m.frees() != after_erase);
  const std::uint64_t before = moved.frees();
  moved = std::move(other);  // moved's own values are gone
  CHECK(moved.frees() != before);
  CHECK(moved.size() == 1);
  CHECK(moved.at(7) == 7);
  const std::uint64_t before_clear = moved.frees();
  moved.clear();
  CHECK(moved.frees() != before_clear);
}

TEST_CASE(
    "key_map: values lie one after the other in nodes that start a cache line, at a stride off "
    "every 128 bytes; an erased value's room is used again") {
  // A server slice is 488 bytes: its node would be 504, which malloc made 512, so the same
  // fields of 4,096 slices fell in half of the L2's sets. Each node starts a line, so a value's
  // first bytes (what a walk reads) fall in the fewest lines.
  struct slice_sized {
    std::array<char, 488> bytes{};
  };
  key_map<slice_sized> m;
  std::vector<const char*> at;
  for (std::uint64_t i = 0; i < 200; ++i) at.push_back(m[i].bytes.data());
  // Within a slab each value follows the last: the distance most of them are apart.
  std::map<std::ptrdiff_t, int> gaps;
  for (std::size_t i = 1; i < at.size(); ++i) ++gaps[at[i] - at[i - 1]];
  const auto [stride, times] = *std::max_element(
      gaps.begin(), gaps.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  CHECK(times > 150);  // a few slabs start elsewhere
  REQUIRE(stride > 0);
  CHECK(stride >= static_cast<std::ptrdiff_t>(sizeof(slice_sized)));
  CHECK(stride % 128 != 0);
  CHECK(stride % 64 == 0);
  // The node (key, value, position) rounded up to a line, and one line more when that is a
  // multiple of 128.
  CHECK(stride <= static_cast<std::ptrdiff_t>(sizeof(slice_sized)) + 16 + 63 + 64);
  for (const char* v : at) CHECK(reinterpret_cast<std::uintptr_t>(v) % 64 == 8);  // after the key
  // Erase and add: the new value takes the freed place.
  const char* freed = m[57].bytes.data();
  REQUIRE(m.erase(57) == 1);
  CHECK(m[1000].bytes.data() == freed);
  CHECK(m[1001].bytes.data() != freed);
}

TEST_CASE("key_map: a value whose construction throws adds nothing, and its room is used again") {
  static int armed = 0;  // throw on the next construction when set
  struct fragile {
    fragile() {
      if (armed) {
        armed = 0;
        throw std::runtime_error("no");
      }
    }
    std::string s = "v";
  };
  key_map<fragile> m;
  for (std::uint64_t i = 0; i < 20; ++i) m[i];
  armed = 1;
  CHECK_THROWS_AS(m[99], std::runtime_error);
  CHECK(m.size() == 20);
  CHECK(m.count(99) == 0);
  const std::size_t before = m.size();
  m[99];  // the slot the throw gave back
  CHECK(m.size() == before + 1);
  std::size_t n = 0;
  for (auto& [id, v] : m) n += v.s.size();
  CHECK(n == 21);
}
