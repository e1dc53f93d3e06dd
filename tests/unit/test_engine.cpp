#include <kvstore/engine/engine.hpp>  // first: the header is self-contained

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

using kvstore::detail::engine;
using kvstore::detail::op_state;

TEST_CASE("ops on one key run in issue order, never at the same time" * doctest::timeout(30)) {
  engine e(4);
  std::vector<int> order;
  std::atomic<int> running{0};
  bool overlap = false;
  auto st = std::make_shared<op_state>(200);
  for (int i = 0; i < 200; ++i) {
    e.submit_sync(
        7, i % 5,
        [&, i] {
          if (running.fetch_add(1) != 0) overlap = true;
          order.push_back(i);
          running.fetch_sub(1);
        },
        st);
  }
  kvstore::op(st).wait();
  CHECK_FALSE(overlap);
  REQUIRE(order.size() == 200);
  for (int i = 0; i < 200; ++i) CHECK(order[i] == i);
}

TEST_CASE("higher priority runs first, ties in issue order" * doctest::timeout(30)) {
  engine e(1);
  std::vector<int> order;
  std::mutex m;
  // Block the single thread so the others queue up.
  std::promise<void> gate, parked;
  auto gf = gate.get_future().share();
  auto st = std::make_shared<op_state>(7);
  e.submit_sync(
      1000, 0,
      [gf, &parked] {
        parked.set_value();
        gf.wait();
      },
      st);
  parked.get_future().wait();  // the only thread is inside the blocker: the rest must queue
  const int prio[] = {0, 5, 1, 5, 9, 1};
  for (int i = 0; i < 6; ++i)
    e.submit_sync(
        static_cast<std::uint64_t>(i), prio[i],
        [&, i] {
          std::lock_guard lk(m);
          order.push_back(i);
        },
        st);
  gate.set_value();
  kvstore::op(st).wait();
  CHECK(order == std::vector<int>{4, 1, 3, 2, 5, 0});
}

TEST_CASE("exceptions reach op::wait, later ops still run" * doctest::timeout(30)) {
  engine e(2);
  auto bad = std::make_shared<op_state>(1);
  e.submit_sync(
      1, 0, [] { throw kvstore::error(kvstore::errc::invalid_argument, "boom"); }, bad);
  auto good = std::make_shared<op_state>(1);
  int x = 0;
  e.submit_sync(
      1, 0, [&] { x = 42; }, good);
  CHECK_THROWS_WITH_AS(kvstore::op(bad).wait(), "boom", kvstore::error);
  kvstore::op(good).wait();
  CHECK(x == 42);
}

TEST_CASE("async completion from another thread holds the key" * doctest::timeout(30)) {
  engine e(2);
  std::atomic<int> seen{0};
  std::thread completer;
  engine::done_fn saved;
  std::mutex m;
  std::condition_variable cv;
  auto a = std::make_shared<op_state>(1);
  e.submit(
      3, 0,
      [&](engine::done_fn d) {
        std::lock_guard lk(m);
        saved = std::move(d);
        cv.notify_all();
      },
      a);
  auto b = std::make_shared<op_state>(1);
  e.submit_sync(
      3, 0, [&] { seen = 1; }, b);
  {
    std::unique_lock lk(m);
    cv.wait(lk, [&] { return static_cast<bool>(saved); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(seen == 0);  // b waits for a
  CHECK_FALSE(kvstore::op(a).ready());
  completer = std::thread([&] { saved(nullptr); });
  kvstore::op(b).wait();
  CHECK(seen == 1);
  completer.join();
}

TEST_CASE("wait_key and wait_all" * doctest::timeout(30)) {
  engine e(2);
  std::atomic<int> n{0};
  for (int i = 0; i < 100; ++i)
    e.submit_sync(
        static_cast<std::uint64_t>(i % 10), 0, [&] { n.fetch_add(1); }, nullptr);
  e.wait_all();
  CHECK(n == 100);
}

TEST_CASE("parallel_for covers the range once, also from inside a task" * doctest::timeout(30)) {
  engine e(2);
  std::vector<int> hits(100000, 0);
  auto st = std::make_shared<op_state>(1);
  e.submit_sync(
      1, 0,
      [&] {
        e.parallel_for(hits.size(), 1000, [&](std::size_t b, std::size_t en) {
          for (std::size_t i = b; i < en; ++i) hits[i] += 1;
        });
      },
      st);
  kvstore::op(st).wait();
  for (int h : hits) REQUIRE(h == 1);
}

TEST_CASE("op::then runs after the op is done and its op waits for it" * doctest::timeout(30)) {
  // Already done: f runs at once, on this thread.
  int ran = 0;
  kvstore::op::done().then([&](std::exception_ptr e) { ran += e ? 100 : 1; }).wait();
  CHECK(ran == 1);

  // Pending: f runs on the thread that completes the last part, after the library's own
  // continuation, and the new op is done only once f has run.
  std::vector<int> order;
  auto st = std::make_shared<op_state>(2, [&](std::exception_ptr) { order.push_back(1); });
  auto next = kvstore::op(st).then([&](std::exception_ptr e) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    order.push_back(e ? -2 : 2);
  });
  CHECK_FALSE(next.ready());
  st->complete_part();
  CHECK_FALSE(next.ready());
  std::thread t([st] { st->complete_part(); });
  next.wait();
  t.join();
  CHECK(order == std::vector<int>{1, 2});
}

TEST_CASE("op::then: the op's error reaches f and the new op; what f throws is its error" *
          doctest::timeout(30)) {
  auto bad = std::make_shared<op_state>(1);
  bool saw_error = false;
  auto next = kvstore::op(bad).then([&](std::exception_ptr e) { saw_error = e != nullptr; });
  bad->complete_part(std::make_exception_ptr(kvstore::error(kvstore::errc::timeout, "late")));
  CHECK_THROWS_WITH_AS(next.wait(), "late", kvstore::error);
  CHECK(saw_error);

  auto thrower = kvstore::op::done().then(
      [](std::exception_ptr) { throw kvstore::error(kvstore::errc::invalid_argument, "from f"); });
  CHECK_THROWS_WITH_AS(thrower.wait(), "from f", kvstore::error);
}
