// client/key_table.hpp: a worker's records by id. A record the table takes counts its pushes in
// the table's array, next to the counts of the records added just before and after it (a
// multi-key push numbers its keys without reading their records); a record it refuses, or never
// saw, keeps its own count. Records and counts never move.
#include <kvstore/client/key_table.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

using kvstore::detail::key_record;
using kvstore::detail::key_table;

namespace {

std::unique_ptr<key_record> record_of(std::int64_t id) {
  return std::make_unique<key_record>(kvstore::key(id), 1, 0,
                                      std::vector<kvstore::detail::slice_ref>{{0, 0, 1}});
}

}  // namespace

TEST_CASE("records the table takes count their pushes side by side, in the order they came") {
  key_table t;
  auto lone = record_of(1);
  CHECK(lone->pushes == &lone->own_pushes);  // no table: its own count
  ++*lone->pushes;
  CHECK(lone->own_pushes.load() == 1);

  // 10,000 keys in one multi-key init: past one chunk of counts.
  std::vector<std::unique_ptr<key_record>> made;
  for (std::int64_t id = 100; id < 10'100; ++id) made.push_back(record_of(id));
  std::vector<key_record*> added;
  REQUIRE(t.add_all(made, added) == made.size());
  REQUIRE(added.size() == 10'000);
  for (std::size_t i = 0; i < added.size(); ++i) {
    CHECK(added[i]->pushes != &added[i]->own_pushes);
    CHECK(added[i]->pushes->load() == 0);
    if (i % 4096 != 0)  // within a chunk: the next count over
      CHECK(added[i]->pushes == added[i - 1]->pushes + 1);
  }
  // One key added alone after them gets a count of its own too, and every count is distinct.
  auto [one, fresh] = t.add(record_of(50));
  REQUIRE(fresh);
  CHECK(one->pushes != &one->own_pushes);
  for (auto* r : added) ++*r->pushes;
  ++*one->pushes;
  ++*one->pushes;
  for (auto* r : added) CHECK(r->pushes->load() == 1);
  CHECK(one->pushes->load() == 2);

  // A record whose id is taken is not the table's: it keeps its own count, and the table's
  // record of that id keeps its count.
  auto [now, taken_fresh] = t.add(record_of(150));
  CHECK_FALSE(taken_fresh);
  CHECK(now == added[50]);
  CHECK(now->pushes->load() == 1);
  std::vector<std::unique_ptr<key_record>> again;
  again.push_back(record_of(20'000));
  again.push_back(record_of(100));  // taken
  std::vector<key_record*> more;
  CHECK(t.add_all(again, more) == 1);
  REQUIRE(more.size() == 1);
  CHECK(more[0]->pushes != &more[0]->own_pushes);
  CHECK(again[1]->pushes == &again[1]->own_pushes);
  CHECK(t.find(100) == added[0]);
  CHECK(t.find(100)->pushes->load() == 1);
}
