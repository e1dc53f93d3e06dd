// client/call_plan.hpp: the plans of recent multi-key calls. A key list is planned when it is
// called a second time; a call follows a plan only when it names the same integer keys in the
// same order with buffers of the planned sizes, at the same version (no key removed, the same
// compression); several key lists stay planned in turn; the least lately followed plan makes
// room; the plans together keep at most twice the keys held; a plan of distinct keys, all
// batched, keeps its batches' frames, cut once, and drops them with its entries.
#include <kvstore/client/call_plan.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

using kvstore::detail::call_plans;
using kvstore::detail::key_record;

namespace {

using buf = std::span<const float>;
using kvstore::detail::batch_frames;

// Cuts a planned call's batches as a worker of two servers, frames of 1 MiB, floats.
batch_frames cut(std::span<const call_plans::key_entry> es) {
  return kvstore::detail::cut_frames(es, 2, std::size_t{1} << 20, sizeof(float));
}
constexpr std::size_t batch_keys = 16;

// A call: keys [first, first + n) with buffers of key % 3 + 1 floats.
struct call {
  std::vector<kvstore::key> keys;
  std::vector<buf> bufs;
};
const std::vector<float> storage(4, 0.0f);
call call_of(std::int64_t first, std::size_t n) {
  call c;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t k = first + static_cast<std::int64_t>(i);
    c.keys.emplace_back(k);
    c.bufs.emplace_back(storage.data(), static_cast<std::size_t>(k % 3 + 1));
  }
  return c;
}

// Plans `c` as the worker's full path does (each key's "record" a distinct fake address): its
// first call is remembered, its second planned.
void plan(call_plans& plans, const call& c, std::size_t held, call_plans::version v = {}) {
  auto* p = plans.start(c.keys, held, v);
  if (!p) p = plans.start(c.keys, held, v);
  REQUIRE(p != nullptr);
  for (std::size_t i = 0; i < c.keys.size(); ++i)
    p->add({reinterpret_cast<key_record*>(0x1000 + 64 * c.keys[i].id()), c.keys[i].id(),
            c.bufs[i].size(), static_cast<int>(i % 2), i % 5 != 0, nullptr});
  plans.finish(*p, false, batch_keys, cut);
}

const call_plans::plan* follow(call_plans& plans, const call& c, call_plans::version v = {}) {
  return plans.find(std::span<const kvstore::key>(c.keys), std::span<const buf>(c.bufs), v);
}

}  // namespace

TEST_CASE("a call follows its plan only with the same keys, sizes and version" *
          doctest::timeout(10)) {
  call_plans plans;
  const call a = call_of(100, 1000);
  CHECK(follow(plans, a) == nullptr);  // nothing planned yet
  plan(plans, a, 1000);
  const auto* p = follow(plans, a);
  REQUIRE(p != nullptr);
  REQUIRE(p->size() == 1000);
  CHECK((*p)[7].id == 107);
  CHECK((*p)[7].total == a.bufs[7].size());
  CHECK((*p)[7].rec == reinterpret_cast<key_record*>(0x1000 + 64 * 107));
  CHECK((*p)[10].batched == false);
  CHECK((*p)[11].batched == true);

  call other = a;  // one key different, anywhere
  other.keys[999] = kvstore::key(5);
  CHECK(follow(plans, other) == nullptr);
  call shorter = a;
  shorter.keys.pop_back();
  shorter.bufs.pop_back();
  CHECK(follow(plans, shorter) == nullptr);
  call reordered = a;
  std::swap(reordered.keys[3], reordered.keys[4]);
  std::swap(reordered.bufs[3], reordered.bufs[4]);
  CHECK(follow(plans, reordered) == nullptr);
  call resized = a;  // the same keys, one buffer of another size
  resized.bufs[500] = buf(storage.data(), 4);
  CHECK(follow(plans, resized) == nullptr);

  // A key removed, or the compression changed, since the plan: not followed, and every plan
  // made before is dropped.
  CHECK(plans.entries() == 1000);
  CHECK(follow(plans, a, {1, 0}) == nullptr);
  CHECK(plans.entries() == 0);
  CHECK(follow(plans, a, {0, 7}) == nullptr);
  plan(plans, a, 1000, {1, 7});
  CHECK(follow(plans, a, {1, 7}) != nullptr);
  CHECK(plans.entries() == 1000);
  CHECK(follow(plans, a) == nullptr);
  CHECK(plans.entries() == 0);
}

TEST_CASE("a key list is planned when called again; an unfinished plan is never followed" *
          doctest::timeout(10)) {
  call_plans plans;
  const call a = call_of(0, 100), b = call_of(1, 100);
  CHECK(plans.start(a.keys, 1000, {}) == nullptr);  // called once: remembered only
  CHECK(plans.start(b.keys, 1000, {}) == nullptr);
  CHECK(plans.entries() == 0);
  auto* p = plans.start(a.keys, 1000, {});  // again: planned
  REQUIRE(p != nullptr);
  CHECK(plans.start(a.keys, 1000, {}) == p);  // the same plan, filled afresh
  // A call naming a key by name: the worker never finishes the plan it started.
  CHECK(follow(plans, a) == nullptr);
  // A planned call whose key is now named (same id): not followed.
  plan(plans, a, 1000);
  REQUIRE(follow(plans, a) != nullptr);
  call named = a;
  named.keys[50] = kvstore::key("w");
  const std::uint64_t hashed = named.keys[50].id();
  call same_ids = a;
  same_ids.keys[50] = kvstore::key(static_cast<std::int64_t>(hashed));
  plan(plans, same_ids, 1000);
  CHECK(follow(plans, same_ids) != nullptr);
  CHECK(follow(plans, named) == nullptr);
}

TEST_CASE("several key lists stay planned; the least lately followed makes room" *
          doctest::timeout(10)) {
  call_plans plans;
  const std::size_t lists = call_plans::max_plans;
  std::vector<call> calls;
  for (std::size_t i = 0; i < lists + 1; ++i)
    calls.push_back(call_of(static_cast<std::int64_t>(10000 * i), 100));
  for (std::size_t i = 0; i < lists; ++i) plan(plans, calls[i], 100000);
  for (std::size_t i = 0; i < lists; ++i) CHECK(follow(plans, calls[i]) != nullptr);
  // Followed in turn 0..7 above; now 0 again, so 1 is the least lately followed.
  CHECK(follow(plans, calls[0]) != nullptr);
  plan(plans, calls[lists], 100000);
  CHECK(follow(plans, calls[lists]) != nullptr);
  CHECK(follow(plans, calls[1]) == nullptr);
  for (std::size_t i = 0; i < lists; ++i)
    if (i != 1) CHECK(follow(plans, calls[i]) != nullptr);
  // Lists called once (sparse rows) are only remembered: however many, no plan makes room.
  for (std::size_t i = 0; i < 4 * lists; ++i)
    CHECK(plans.start(call_of(static_cast<std::int64_t>(500000 + 1000 * i), 100).keys, 100000,
                      {}) == nullptr);
  for (std::size_t i = 0; i <= lists; ++i)
    if (i != 1) CHECK(follow(plans, calls[i]) != nullptr);
}

TEST_CASE("the plans keep at most twice the keys held" * doctest::timeout(10)) {
  call_plans plans;
  // 1,000 keys held; calls of 400 keys each: at most 2,000 entries, so five plans at most.
  std::vector<call> calls;
  for (int i = 0; i < 8; ++i) calls.push_back(call_of(1000 * i, 400));
  for (auto& c : calls) {
    plan(plans, c, 1000);
    CHECK(plans.entries() <= 2000);
  }
  CHECK(follow(plans, calls[7]) != nullptr);  // the newest is kept
  CHECK(follow(plans, calls[0]) == nullptr);  // the oldest made room
  // It kept its signature: called again, it is planned at once.
  CHECK(plans.start(calls[0].keys, 1000, {}) != nullptr);
  // A call larger than the bound is still planned (alone).
  const call big = call_of(50000, 3000);
  plan(plans, big, 1000);
  CHECK(follow(plans, big) != nullptr);
  CHECK(plans.entries() == 3000);
}

TEST_CASE("a plan's entries, shared, outlive the plan; what the call was keeps with it" *
          doctest::timeout(10)) {
  call_plans plans;
  const call c = call_of(100, 50);
  auto* p = plans.start(c.keys, 1000, {});
  CHECK(p == nullptr);  // remembered
  p = plans.start(c.keys, 1000, {});
  REQUIRE(p != nullptr);
  for (std::size_t i = 0; i < c.keys.size(); ++i)
    p->add({nullptr, c.keys[i].id(), c.bufs[i].size(), 0, true, nullptr});
  plans.finish(*p, /*repeats=*/false, batch_keys, cut);
  const auto* followed = follow(plans, c);
  REQUIRE(followed != nullptr);
  CHECK(followed->info.all_batched);
  CHECK_FALSE(followed->info.repeats);
  // Its batches of 16, 16, 16 and 2 keys, each cut into one frame (all on server 0).
  REQUIRE(followed->info.cuts != nullptr);
  const auto& cuts = *followed->info.cuts;
  REQUIRE(cuts.size() == 4);
  for (std::size_t b = 0; b < 4; ++b) {
    const std::size_t n = b < 3 ? 16 : 2;
    CHECK(cuts[b].order.size() == n);
    REQUIRE(cuts[b].frames.size() == 1);
    CHECK(cuts[b].frames[0].keys() == n);
    std::uint64_t elements = 0;
    for (std::size_t i = 0; i < n; ++i) elements += c.bufs[16 * b + i].size();
    CHECK(cuts[b].frames[0].elements == elements);
  }
  const auto shared = followed->shared_entries();
  // A new version drops every plan; the shared entries stay whole, and no longer count.
  CHECK(follow(plans, c, {1, 0}) == nullptr);
  CHECK(plans.entries() == 0);
  REQUIRE(shared->size() == 50);
  for (std::size_t i = 0; i < 50; ++i) CHECK((*shared)[i].id == c.keys[i].id());
  // Planned anew (every fifth key not batched, so not all_batched), the old entries are still
  // not touched.
  plan(plans, c, 1000, {1, 0});
  const auto* again = follow(plans, c, {1, 0});
  REQUIRE(again != nullptr);
  CHECK_FALSE(again->info.all_batched);
  CHECK(again->info.cuts == nullptr);  // its calls go key group by key group, as split says
  CHECK(again->shared_entries() != shared);
  CHECK((*shared)[49].id == c.keys[49].id());
  CHECK((*shared)[49].rec == nullptr);
}

TEST_CASE("a plan's cuts go with its entries: with repeats none, dropped for room gone" *
          doctest::timeout(10)) {
  call_plans plans;
  const call c = call_of(100, 40);
  auto plan_all_batched = [&](const call& k, bool repeats) {
    auto* p = plans.start(k.keys, 100, {});
    if (!p) p = plans.start(k.keys, 100, {});
    REQUIRE(p != nullptr);
    for (std::size_t i = 0; i < k.keys.size(); ++i)
      p->add({nullptr, k.keys[i].id(), k.bufs[i].size(), static_cast<int>(i % 2), true, nullptr});
    plans.finish(*p, repeats, batch_keys, cut);
  };
  plan_all_batched(c, /*repeats=*/true);
  CHECK(follow(plans, c)->info.cuts == nullptr);  // its keys go in one merged batch
  plan_all_batched(c, false);
  const auto* p = follow(plans, c);
  REQUIRE(p != nullptr);
  REQUIRE(p->info.cuts != nullptr);
  // Two servers: each batch's keys by server, the even ones first.
  const batch_frames& first = (*p->info.cuts)[0];
  REQUIRE(first.frames.size() == 2);
  CHECK(first.frames[0].server == 0);
  CHECK(first.frames[1].server == 1);
  CHECK(first.order[0] == 0);
  CHECK(first.order[8] == 1);
  const std::weak_ptr<const std::vector<batch_frames>> held = p->info.cuts;
  // Other lists fill the bound of twice the 100 keys held: c's plan drops its entries and cuts.
  for (int i = 1; i <= 5; ++i) plan_all_batched(call_of(1000 * i, 60), false);
  CHECK(follow(plans, c) == nullptr);
  CHECK(held.expired());
}
