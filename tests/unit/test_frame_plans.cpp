// server/frame_plans.hpp: the key lists of recent batched frames and their slices. A list is
// remembered the first time and planned the second; a plan is found only for the same length,
// element type and signature ids, and only while no slice was freed; each entry keeps the id and
// element count its slice was found for, so a frame is compared with its plan without reading a
// slice; small frames are never planned; whatever is sent, the plans keep at most max_plans lists
// and twice the held slices.
#include <kvstore/server/frame_plans.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

using kvstore::wire::dtype;

namespace {

// A slice (server/slice.hpp's key_slice), as a plan's test needs one: the plan reads none of it.
struct slice {
  std::uint64_t key = 0, total = 0;
  dtype type = dtype::f32;
};
using plans_t = kvstore::detail::frame_plans<slice>;

// A frame naming keys [first, first + n), one element each; its entries' text and its slices.
struct frame {
  std::string meta;
  std::vector<slice*> slices;
  kvstore::wire::batch_entries entries() const { return kvstore::wire::batch_entries(meta); }
};
std::deque<slice> store;  // the "shard's" slices: they never move
frame frame_of(std::uint64_t first, std::size_t n) {
  frame f;
  f.meta.assign(n * kvstore::wire::batch_entry_size, '\0');
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t k = first + i;
    kvstore::wire::put_batch_entry(f.meta.data() + i * kvstore::wire::batch_entry_size, {k, 1, 0});
    f.slices.push_back(&store.emplace_back(slice{k, 1, dtype::f32}));
  }
  return f;
}

// A frame's full lookup found its slices: as batch_ops does after one.
void found(plans_t& p, const frame& f, std::uint64_t frees = 0, std::size_t held = 1 << 20) {
  p.found(f.entries(), dtype::f32, f.slices, frees, held);
}
const std::vector<plans_t::entry>* find(plans_t& p, const frame& f, std::uint64_t frees = 0,
                                        dtype type = dtype::f32) {
  return p.find(f.entries(), type, frees);
}

}  // namespace

TEST_CASE("a frame's list is planned when found a second time, and found by its signature" *
          doctest::timeout(10)) {
  plans_t p;
  const frame a = frame_of(1, 100);
  CHECK(find(p, a) == nullptr);
  found(p, a);
  CHECK(find(p, a) == nullptr);  // seen once: remembered, not planned
  CHECK(p.pointers() == 0);
  found(p, a);
  const auto* plan = find(p, a);
  REQUIRE(plan != nullptr);
  REQUIRE(plan->size() == a.slices.size());
  for (std::size_t i = 0; i < plan->size(); ++i) {
    CHECK((*plan)[i].slice == a.slices[i]);
    CHECK((*plan)[i].key == 1 + i);
    CHECK((*plan)[i].elements == 1);
  }
  CHECK(p.pointers() == 100);
  CHECK(find(p, a, 0, dtype::f64) == nullptr);  // another element type
  CHECK(find(p, frame_of(1, 99)) == nullptr);   // another length
  CHECK(find(p, frame_of(2, 100)) == nullptr);  // other ids
  // The same signature with another key inside, or another element count: found, and those
  // entries do not name their planned slices (the caller looks the frame up instead).
  frame b = a;
  kvstore::wire::put_batch_entry(b.meta.data() + 7 * kvstore::wire::batch_entry_size, {9999, 1, 0});
  kvstore::wire::put_batch_entry(b.meta.data() + 9 * kvstore::wire::batch_entry_size, {10, 2, 0});
  REQUIRE(find(p, b) == plan);
  CHECK_FALSE((*plan)[7].names(b.entries()[7]));
  CHECK_FALSE((*plan)[9].names(b.entries()[9]));
  CHECK((*plan)[6].names(b.entries()[6]));
  CHECK((*plan)[8].names(b.entries()[8]));
  // A plan is followed whatever an entry's aux (a push's number changes every step).
  kvstore::wire::put_batch_entry(b.meta.data() + 6 * kvstore::wire::batch_entry_size, {7, 1, 42});
  CHECK((*plan)[6].names(b.entries()[6]));
  // Small frames are looked up every time.
  const frame small = frame_of(500, plans_t::min_keys - 1);
  found(p, small);
  found(p, small);
  CHECK(find(p, small) == nullptr);
}

TEST_CASE("a freed slice drops every plan" * doctest::timeout(10)) {
  plans_t p;
  const frame a = frame_of(1, 50), b = frame_of(100, 50);
  for (int i = 0; i < 2; ++i) {
    found(p, a, 7);
    found(p, b, 7);
  }
  CHECK(find(p, a, 7) != nullptr);
  CHECK(find(p, a, 8) == nullptr);  // the map freed a slice since
  CHECK(find(p, b, 8) == nullptr);
  CHECK(p.pointers() == 0);
  CHECK(p.lists() == 0);
  found(p, a, 8);
  found(p, a, 8);
  CHECK(find(p, a, 8) != nullptr);
}

TEST_CASE("the plans keep at most max_plans lists and twice the held slices in pointers" *
          doctest::timeout(10)) {
  plans_t p;
  // Pointers: 80 held slices, frames of 60 keys: three cannot all stay planned.
  const frame a = frame_of(1, 60), b = frame_of(1000, 60), c = frame_of(2000, 60);
  for (const frame* f : {&a, &a, &b, &b}) found(p, *f, 0, 80);
  CHECK(p.pointers() == 120);
  CHECK(find(p, a) != nullptr);  // a is now more lately used than b
  found(p, c, 0, 80);
  found(p, c, 0, 80);
  CHECK(p.pointers() <= 160);
  CHECK(find(p, c) != nullptr);
  CHECK(find(p, a) != nullptr);
  CHECK(find(p, b) == nullptr);  // the least lately used made room
  // Lists: a peer sending ever new frames never makes them grow past max_plans.
  for (std::size_t i = 0; i < 3 * plans_t::max_plans; ++i) {
    const frame f = frame_of(10'000 + 100 * i, plans_t::min_keys);
    found(p, f, 0, 80);
    found(p, f, 0, 80);
    CHECK(p.lists() <= plans_t::max_plans);
    CHECK(p.pointers() <= 160);
  }
  CHECK(p.lists() == plans_t::max_plans);
}

TEST_CASE("frames seen once never push a plan out" * doctest::timeout(10)) {
  plans_t p;
  std::vector<frame> planned;
  for (std::size_t i = 0; i < plans_t::max_plans; ++i) {
    planned.push_back(frame_of(100'000 + 100 * i, plans_t::min_keys));
    found(p, planned.back());
    found(p, planned.back());
  }
  // A peer's ever new frames (or sparse rows): remembered, each in place of an older memory.
  for (std::size_t i = 0; i < 3 * plans_t::max_plans; ++i)
    found(p, frame_of(500'000 + 100 * i, plans_t::min_keys));
  CHECK(p.lists() == plans_t::max_plans);
  CHECK(p.remembered() <= plans_t::max_plans);
  for (const frame& f : planned) CHECK(find(p, f) != nullptr);
}

TEST_CASE("a list that made room, or was forgotten, is planned again when it comes back" *
          doctest::timeout(10)) {
  plans_t p;
  std::vector<frame> planned;
  for (std::size_t i = 0; i <= plans_t::max_plans; ++i) {
    planned.push_back(frame_of(100'000 + 100 * i, plans_t::min_keys));
    found(p, planned.back());
    found(p, planned.back());
  }
  // The last one took the first one's place (the least lately used).
  const frame& first = planned.front();
  CHECK(find(p, first) == nullptr);
  CHECK(find(p, planned.back()) != nullptr);
  // The first comes back: it kept no memory of being planned, so it is remembered, then
  // planned, and found again; the list whose place it took is not.
  found(p, first);
  CHECK(find(p, first) == nullptr);
  found(p, first);
  CHECK(find(p, first) != nullptr);
  CHECK(find(p, planned[1]) == nullptr);
  for (std::size_t i = 2; i < planned.size(); ++i) CHECK(find(p, planned[i]) != nullptr);
  CHECK(p.lists() == plans_t::max_plans);

  // A list seen once is forgotten after max_plans other lists were seen once since.
  const frame once = frame_of(900'000, plans_t::min_keys);
  found(p, once);
  for (std::size_t i = 0; i < plans_t::max_plans; ++i)
    found(p, frame_of(1'000'000 + 100 * i, plans_t::min_keys));
  found(p, once);  // seen "once" again: remembered only
  CHECK(find(p, once) == nullptr);
  CHECK(p.remembered() == plans_t::max_plans);
  found(p, once);
  CHECK(find(p, once) != nullptr);
  CHECK(p.remembered() == plans_t::max_plans - 1);
}
