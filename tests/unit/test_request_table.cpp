// client/pending.hpp: a worker's table of requests waiting for answers: ids, per-server counts
// (what decides a direct write), deadlines, runs answered at once, and re-sends in id order;
// its entries reused, and detail/id_ring.hpp, the index of them by id.
#include <kvstore/client/pending.hpp>  // first: the header is self-contained
#include <kvstore/detail/id_ring.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

using kvstore::detail::pending_request;
using kvstore::detail::request_table;
using namespace std::chrono_literals;

namespace {

pending_request req(std::chrono::milliseconds timeout = 0ms) {
  pending_request r;
  r.done = std::make_shared<kvstore::detail::op_state>(1);
  r.timeout = timeout;
  return r;
}

}  // namespace

TEST_CASE("request_table: ids, per-server counts, take" * doctest::timeout(30)) {
  request_table t;
  const auto now = std::chrono::steady_clock::now();
  const auto a = t.next_ids(), b = t.next_ids(), c = t.next_ids();
  CHECK(b == a + 1);
  CHECK(c == b + 1);
  CHECK(t.add(a, 0, req(), now, 1000ms) == 0);  // nothing waited on server 0 before
  CHECK(t.add(b, 0, req(), now, 1000ms) == 1);
  CHECK(t.add(c, request_table::to_scheduler, req(), now, 1000ms) == 0);
  CHECK(t.in_flight(0) == 2);
  CHECK(t.in_flight(1) == 0);
  CHECK(t.size() == 3);
  REQUIRE(t.find(b) != nullptr);
  CHECK(t.find(b)->peer == 0);
  CHECK(t.find(b)->deadline == now + 1000ms);  // the default timeout
  auto got = t.take(a);
  REQUIRE(got);
  CHECK(got->peer == 0);
  CHECK(!t.take(a));  // answered once
  CHECK(t.find(a) == nullptr);
  CHECK(t.in_flight(0) == 1);
  CHECK(t.take_all().size() == 2);
  CHECK(t.in_flight(0) == 0);
  CHECK(t.size() == 0);
}

TEST_CASE("request_table: a run of fused pushes answered at once" * doctest::timeout(30)) {
  request_table t;
  const auto now = std::chrono::steady_clock::now();
  const auto first = t.next_ids(4);
  std::vector<std::shared_ptr<kvstore::detail::op_state>> ops;
  for (std::uint64_t i = 0; i < 4; ++i) {
    auto r = req();
    ops.push_back(r.done);
    t.add(first + i, 1, std::move(r), now, 1000ms);
  }
  CHECK(t.take(first + 2));         // failed earlier (its deadline): skipped by the run
  auto run = t.take_run(first, 4);  // more than wait now: found by a walk of the table
  REQUIRE(run.size() == 3);
  for (int i : {0, 1, 3})  // the requests' own ops
    CHECK(std::find(run.begin(), run.end(), ops[static_cast<std::size_t>(i)]) != run.end());
  CHECK(t.in_flight(1) == 0);
  const auto second = t.next_ids(3);
  for (std::uint64_t i = 0; i < 3; ++i) t.add(second + i, 1, req(), now, 1000ms);
  const auto other = t.next_ids();
  t.add(other, 2, req(), now, 1000ms);
  const auto looked_up = t.take_run(second, 2);  // fewer than wait: looked up one by one
  REQUIRE(looked_up.size() == 2);
  CHECK(looked_up[0] != nullptr);
  CHECK(looked_up[1] != nullptr);
  CHECK(t.size() == 2);
  // Ids never sent are a protocol error, and take nothing.
  CHECK_THROWS_AS(t.take_run(second, 5), kvstore::error);
  CHECK_THROWS_AS(t.take_run(~std::uint64_t{0}, 1), kvstore::error);
  CHECK_THROWS_AS(t.take_run(0, 1), kvstore::error);
  CHECK_THROWS_AS(t.take_run(1, ~std::uint64_t{0}), kvstore::error);
  CHECK(t.size() == 2);
  CHECK(t.take_run(second + 2, 2).size() == 2);  // the rest, up to the last id sent
}

TEST_CASE("request_table: deadlines, a lost peer, re-sends oldest first" * doctest::timeout(30)) {
  request_table t;
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(t.next_ids());
    auto r = req(i % 2 ? 10ms : 0ms);  // odd ones have their own, shorter timeout
    r.frames.resize(static_cast<std::size_t>(i + 1));
    t.add(ids.back(), i % 3, std::move(r), now, 1000ms);
  }
  auto expired = t.take_expired(now + 20ms);
  CHECK(expired.size() == 3);
  for (auto& r : expired) CHECK(r.timeout == 10ms);
  CHECK(t.take_expired(now + 20ms).empty());
  // Left: ids[0] (peer 0), ids[2] (peer 2), ids[4] (peer 1).
  auto again = t.frames_of(2);
  REQUIRE(again.size() == 1);
  CHECK(again[0].first == ids[2]);
  CHECK(again[0].second.size() == 3);
  CHECK(t.size() == 3);  // frames_of copies, takes nothing
  CHECK(t.take_peer(0).size() == 1);
  CHECK(t.in_flight(0) == 0);
  CHECK(t.in_flight(1) == 1);
  CHECK(t.in_flight(2) == 1);
}

TEST_CASE("request_table: entries are reused, stay put, and go after a peak" *
          doctest::timeout(30)) {
  request_table t;
  const auto now = std::chrono::steady_clock::now();
  // Rounds of 1,000 requests in flight, all answered: the entries of the first round serve the
  // others (a one-key op costs no block of its own once the table is warm).
  for (int round = 0; round < 20; ++round) {
    const auto first = t.next_ids(1000);
    for (std::uint64_t i = 0; i < 1000; ++i) t.add(first + i, 0, req(), now, 1000ms);
    CHECK(t.entries() == 1000);
    for (std::uint64_t i = 0; i < 1000; ++i) REQUIRE(t.take(first + i));
  }
  CHECK(t.size() == 0);
  CHECK(t.entries() == 1000);  // kept for the next round (under kept_entries)

  // A request stays where it is while others come and go around it.
  const auto kept = t.next_ids();
  auto r = req();
  r.frames.resize(2);
  t.add(kept, 1, std::move(r), now, 1000ms);
  pending_request* at = t.find(kept);
  REQUIRE(at != nullptr);
  const auto many = t.next_ids(2 * request_table::kept_entries);
  for (std::uint64_t i = 0; i < 2 * request_table::kept_entries; ++i)
    t.add(many + i, 0, req(), now, 1000ms);
  for (std::uint64_t i = 0; i < 2 * request_table::kept_entries; i += 2) CHECK(t.take(many + i));
  CHECK(t.find(kept) == at);
  CHECK(at->peer == 1);
  CHECK(at->frames.size() == 2);
  CHECK(t.in_flight(0) == request_table::kept_entries);
  CHECK(t.in_flight(1) == 1);

  // Past kept_entries, the entries go once no request waits (here in the middle of take_all),
  // and the table works on as before.
  CHECK(t.entries() > request_table::kept_entries);
  CHECK(t.take_all().size() == request_table::kept_entries + 1);
  CHECK(t.entries() == 0);
  CHECK(t.in_flight(0) == 0);
  CHECK(t.in_flight(1) == 0);
  const auto after = t.next_ids();
  t.add(after, 0, req(), now, 1000ms);
  CHECK(t.find(kept) == nullptr);
  REQUIRE(t.take(after));
  CHECK(t.size() == 0);
}

TEST_CASE("id_ring: find, insert and erase agree with unordered_map, stragglers too" *
          doctest::timeout(30)) {
  kvstore::detail::id_ring<int> ring;
  std::unordered_map<std::uint64_t, int*> truth;
  std::vector<int> objects(64);
  std::mt19937_64 rng(7);
  std::uint64_t next = 1;
  std::vector<std::uint64_t> live;
  std::size_t max_aside = 0;
  for (int step = 0; step < 200'000; ++step) {
    // Up to ~300 in flight, answered mostly oldest first; one in 500 is held for long.
    if (live.size() < 300 && rng() % 2) {
      const std::uint64_t id = next++;
      int* v = &objects[id % objects.size()];
      ring.insert(id, v);
      truth.emplace(id, v);
      live.push_back(id);
    } else if (!live.empty()) {
      std::size_t i = rng() % 8 == 0 ? rng() % live.size() : 0;
      if (live[i] % 500 == 0 && rng() % 100) i = (i + 1) % live.size();  // a straggler stays
      const std::uint64_t id = live[i];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      CHECK(ring.erase(id) == truth.at(id));
      truth.erase(id);
      CHECK(ring.erase(id) == nullptr);  // gone
    }
    if (step % 97 == 0) {
      REQUIRE(ring.size() == truth.size());
      for (const auto& [id, v] : truth) REQUIRE(ring.find(id) == v);
      CHECK(ring.find(next) == nullptr);  // not handed out yet
      if (next > 4096) {                  // an id long done, or a straggler still waiting
        const auto it = truth.find(next - 4096);
        CHECK(ring.find(next - 4096) == (it == truth.end() ? nullptr : it->second));
      }
    }
    CHECK(ring.aside() <= ring.size());
    max_aside = std::max(max_aside, ring.aside());
  }
  CHECK(max_aside > 0);  // stragglers were moved aside, and found there
  for (std::uint64_t id : live) CHECK(ring.erase(id) == truth.at(id));
  CHECK(ring.size() == 0);
  CHECK(ring.aside() == 0);
  ring.clear();
  CHECK(ring.find(1) == nullptr);
  ring.insert(5, &objects[0]);
  CHECK(ring.find(5) == &objects[0]);
}
