// transport/send_queue.hpp: a connection's frames leave highest priority first and, within a
// priority, in the order queued; checked against a stable sort doing the same random work.
#include <kvstore/transport/send_queue.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

using kvstore::transport::out_frame;
using kvstore::transport::send_queue;

namespace {

out_frame frame(std::int32_t priority, std::uint64_t id) {
  out_frame f;
  f.h.priority = priority;
  f.h.req_id = id;
  return f;
}

}  // namespace

TEST_CASE("send_queue: priority first, then the order queued" * doctest::timeout(60)) {
  send_queue q;
  q.push(frame(0, 1));
  q.push(frame(5, 2));
  q.push(frame(0, 3));
  q.push(frame(-3, 4));
  q.push(frame(5, 5));
  std::vector<std::uint64_t> order;
  while (!q.empty()) {
    order.push_back(q.front().h.req_id);
    q.pop();
  }
  CHECK(order == std::vector<std::uint64_t>{2, 5, 1, 3, 4});
  CHECK(q.size() == 0);
}

TEST_CASE("send_queue: agrees with a per-priority FIFO model under random work" *
          doctest::timeout(60)) {
  std::mt19937 rng(7);
  send_queue q;
  std::map<std::int32_t, std::deque<std::uint64_t>, std::greater<>> model;
  std::size_t queued = 0;
  std::uint64_t next = 0;
  for (int step = 0; step < 200'000; ++step) {
    if (queued == 0 || rng() % 100 < 55) {
      // Mostly a few priorities, sometimes a rare one (a run made and dropped again).
      const std::int32_t p = rng() % 10 ? static_cast<std::int32_t>(rng() % 3) - 1
                                        : static_cast<std::int32_t>(rng() % 1000) - 500;
      q.push(frame(p, next));
      model[p].push_back(next++);
      ++queued;
    } else {
      auto top = model.begin();
      REQUIRE(q.front().h.priority == top->first);
      REQUIRE(q.front().h.req_id == top->second.front());
      q.pop();
      top->second.pop_front();
      if (top->second.empty()) model.erase(top);
      --queued;
    }
    REQUIRE(q.size() == queued);
    REQUIRE(q.empty() == (queued == 0));
  }
}

TEST_CASE("send_queue: a popped frame lets go of its payload; storage stays bounded" *
          doctest::timeout(60)) {
  send_queue q;
  auto payload = std::make_shared<int>(1);
  // A run that never drains: 100 frames queued while a million pass through.
  for (int i = 0; i < 100; ++i) {
    auto f = frame(0, static_cast<std::uint64_t>(i));
    f.keep = payload;
    q.push(std::move(f));
  }
  for (int i = 100; i < 1'000'000; ++i) {
    auto f = frame(0, static_cast<std::uint64_t>(i));
    f.keep = payload;
    q.push(std::move(f));
    REQUIRE(q.front().h.req_id == static_cast<std::uint64_t>(i - 100));
    q.pop();
  }
  CHECK(payload.use_count() == 1 + 100);
  CHECK(q.slots() <= 512);
  q.clear();
  CHECK(payload.use_count() == 1);
  CHECK(q.empty());
}

namespace {

out_frame acks(std::uint64_t first, std::uint64_t n, std::int32_t sender = 3) {
  out_frame f;
  f.h = kvstore::wire::acks_header(first, n);
  f.h.sender = sender;
  return f;
}

}  // namespace

TEST_CASE("send_queue: acks whose ids follow on merge into one answer" * doctest::timeout(60)) {
  send_queue q;
  CHECK(q.push(acks(10, 1)));
  CHECK(!q.push(acks(11, 1)));  // merged: nothing more queued
  CHECK(!q.push(acks(12, 3)));  // a run of its own continues it too
  CHECK(q.size() == 1);
  CHECK(q.front().h.req_id == 10);
  CHECK(q.front().h.aux == 5);
  CHECK(kvstore::wire::is_acks(q.front().h));

  // Not merged: a gap in the ids, another sender, an error, a text, a frame between them.
  CHECK(q.push(acks(16, 1)));
  CHECK(q.push(acks(17, 1, /*sender=*/4)));
  auto err = acks(18, 1, 4);
  err.h.status = 7;
  CHECK(q.push(std::move(err)));
  auto text = acks(19, 1, 4);
  text.meta = "why";
  text.h.meta_len = 3;
  CHECK(q.push(std::move(text)));
  CHECK(q.push(frame(0, 99)));  // a response that is not an ack
  CHECK(q.push(acks(20, 1, 4)));
  CHECK(q.size() == 7);

  // What the connection has taken to write no longer grows: the next ack starts a new frame.
  while (q.size() > 1) q.pop();
  q.pop();
  CHECK(q.empty());
  CHECK(q.push(acks(21, 1, 4)));
  CHECK(q.size() == 1);

  // Only within one priority, at the back of its run: a higher-priority frame in between does
  // not split them, since it is sent first anyway.
  auto high = frame(5, 100);
  CHECK(q.push(std::move(high)));
  CHECK(!q.push(acks(22, 1, 4)));
  CHECK(q.size() == 2);
  CHECK(q.front().h.req_id == 100);
  q.pop();
  CHECK(q.front().h.aux == 2);
}

TEST_CASE("send_queue: an ack header extends the acks queued last, without a frame" *
          doctest::timeout(60)) {
  send_queue q;
  CHECK(!q.extend_acks(acks(1, 1).h));  // nothing queued: it needs a frame of its own
  CHECK(q.push(acks(1, 1)));
  CHECK(q.extend_acks(acks(2, 1).h));
  CHECK(q.extend_acks(acks(3, 2).h));
  CHECK(q.size() == 1);
  CHECK(q.front().h.aux == 4);
  // Not extended: a gap, another sender, another priority, an error.
  CHECK(!q.extend_acks(acks(6, 1).h));
  CHECK(!q.extend_acks(acks(5, 1, /*sender=*/4).h));
  auto other_priority = acks(5, 1);
  other_priority.h.priority = 2;
  CHECK(!q.extend_acks(other_priority.h));
  auto err = acks(5, 1);
  err.h.status = 7;
  CHECK(!q.extend_acks(err.h));
  CHECK(q.size() == 1);
  CHECK(q.front().h.aux == 4);
  // Behind a frame that is not an ack: a frame of its own.
  CHECK(q.push(frame(0, 99)));
  CHECK(!q.extend_acks(acks(5, 1).h));
  CHECK(q.size() == 2);
}
