#include <kvstore/engine/engine.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <mutex>
#include <random>
#include <span>
#include <string>
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

TEST_CASE("op::wait: every thread asleep on an op wakes when its last part completes" *
          doctest::timeout(30)) {
  // The last part wakes an op's sleepers only when it has some: each must still be woken.
  for (int round = 0; round < 50; ++round) {
    auto st = std::make_shared<op_state>(2);
    std::atomic<int> woke{0};
    std::vector<std::thread> waiters;
    for (int i = 0; i < 3; ++i)
      waiters.emplace_back([st, &woke] {
        kvstore::op(st).wait();
        ++woke;
      });
    st->complete_part();
    std::this_thread::sleep_for(std::chrono::microseconds(round * 20));  // some asleep, or not
    CHECK(woke.load() == 0);
    st->complete_part();
    for (auto& t : waiters) t.join();
    CHECK(woke.load() == 3);
    CHECK(st->sleepers == 0);
  }
  // An op already done does not sleep.
  auto done = std::make_shared<op_state>(1);
  done->complete_part();
  kvstore::op(done).wait();
  CHECK(done->sleepers == 0);
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

// ---- ops over many keys (batched multi-key calls), on slots the caller keeps
// ---------------------

using kvstore::detail::key_slot;

namespace {

// Ops over random keys record, per key, the order they ran in, and whether two ever ran on a key
// at once; some complete later, from a thread of their own.
struct key_log_run {
  explicit key_log_run(int keys) : log(static_cast<std::size_t>(keys)), holders(log.size()) {}
  std::vector<std::vector<int>> log;      // per key: ops in the order they ran
  std::vector<std::atomic<int>> holders;  // ops running on the key now
  std::mutex m;
  std::atomic<bool> overlap{false};
  std::vector<std::thread> finishers;

  // Op i's task over keys ks; `later`: it completes from another thread after `delay`.
  auto task(int i, std::vector<int> ks, bool later, std::chrono::microseconds delay) {
    return [this, i, ks = std::move(ks), later, delay](engine::done_fn done) {
      for (int k : ks)
        if (holders[static_cast<std::size_t>(k)].fetch_add(1) != 0) overlap = true;
      {
        std::lock_guard lk(m);
        for (int k : ks) log[static_cast<std::size_t>(k)].push_back(i);
      }
      auto finish = [this, ks, done] {
        for (int k : ks) holders[static_cast<std::size_t>(k)].fetch_sub(1);
        done(nullptr);
      };
      if (!later) return finish();
      std::lock_guard lk(m);
      finishers.emplace_back([finish, delay] {
        std::this_thread::sleep_for(delay);
        finish();
      });
    };
  }
  void join() {
    std::lock_guard lk(m);
    for (auto& t : finishers) t.join();
  }
};

// Slots of n keys, every one of them in `all`, and the names of the ops that ran, in order.
struct named_ops {
  explicit named_ops(std::size_t n) : slots(n) {
    for (auto& s : slots) all.push_back(&s);
  }
  // A task that logs `name`, then completes, or keeps its completion in *keep and says so
  // through `kept`.
  auto logged(std::string name, engine::done_fn* keep = nullptr,
              std::promise<void>* kept = nullptr) {
    return [this, name, keep, kept](engine::done_fn done) {
      {
        std::lock_guard lk(m);
        order.push_back(name);
      }
      if (!keep) return done(nullptr);
      *keep = std::move(done);
      kept->set_value();
    };
  }
  std::vector<key_slot> slots;
  std::vector<key_slot*> all;
  std::vector<std::string> order;
  std::mutex m;
};

}  // namespace

TEST_CASE("ops over many keys and one-key ops: per-key issue order, never two on a key at once" *
          doctest::timeout(60)) {
  engine e(4);
  constexpr int keys = 16, ops = 3000;
  std::vector<key_slot> slots(keys);
  key_log_run run(keys);
  auto st = std::make_shared<op_state>(ops);
  std::mt19937 rng(12);
  for (int i = 0; i < ops; ++i) {
    std::vector<int> ks;
    if (i % 3 == 0) {  // a batched op over a random subset of keys
      for (int k = 0; k < keys; ++k)
        if (rng() % 3 == 0) ks.push_back(k);
      if (ks.empty()) ks.push_back(static_cast<int>(rng() % keys));
    } else {
      ks.push_back(static_cast<int>(rng() % keys));
    }
    // i % 7 == 0: completes from another thread, after the task returned
    auto task = run.task(i, ks, i % 7 == 0, std::chrono::microseconds(200));
    if (ks.size() == 1 && i % 3) {
      e.submit(slots[static_cast<std::size_t>(ks[0])], static_cast<int>(rng() % 3), task, st,
               i % 2 == 0);
    } else {
      std::vector<key_slot*> ps;
      for (int k : ks) ps.push_back(&slots[static_cast<std::size_t>(k)]);
      e.submit(std::span<key_slot* const>(ps), static_cast<int>(rng() % 3), task, st, i % 2 == 0);
    }
  }
  kvstore::op(st).wait();
  run.join();
  e.wait_all();
  CHECK_FALSE(run.overlap.load());
  std::size_t total = 0;
  for (int k = 0; k < keys; ++k) {
    const auto& l = run.log[static_cast<std::size_t>(k)];
    total += l.size();
    CHECK(std::is_sorted(l.begin(), l.end()));
    CHECK(slots[static_cast<std::size_t>(k)].completed == l.size());
    CHECK_FALSE(slots[static_cast<std::size_t>(k)].busy());
  }
  CHECK(total > static_cast<std::size_t>(ops));  // the batched ops ran on several keys each
}

TEST_CASE("an op over many keys waits for a key still held, and is ordered by priority" *
          doctest::timeout(30)) {
  engine e(1);
  key_slot a, b, c, d;
  std::vector<std::string> order;
  std::mutex m;
  auto log = [&](std::string s) {
    return [&, s](engine::done_fn done) {
      {
        std::lock_guard lk(m);
        order.push_back(s);
      }
      done(nullptr);
    };
  };
  // Key a is held by an op that completes only when told.
  engine::done_fn held;
  std::promise<void> got;
  auto st = std::make_shared<op_state>(4);
  e.submit(
      a, 0,
      [&](engine::done_fn done) {
        held = done;
        got.set_value();
      },
      st);
  got.get_future().wait();
  key_slot* ab[] = {&a, &b};
  key_slot* cd[] = {&c, &d};
  e.submit(std::span<key_slot* const>(ab), 9, log("ab"), st);  // waits for a
  e.submit(b, 9, log("b"), st);                                // waits for ab
  e.submit(std::span<key_slot* const>(cd), 1, log("cd"), st);  // free: runs
  e.wait_slot(d);
  {
    std::lock_guard lk(m);
    CHECK(order == std::vector<std::string>{"cd"});
  }
  held(nullptr);
  kvstore::op(st).wait();
  e.wait_slot(b);
  CHECK(order == std::vector<std::string>{"cd", "ab", "b"});
  CHECK(a.completed == 2);
  CHECK(b.completed == 2);
  CHECK(b.issued == 2);
}

TEST_CASE("wait_slot returns once the ops issued on the slot before it are done" *
          doctest::timeout(30)) {
  engine e(2);
  key_slot s;
  std::atomic<int> done_ops{0};
  auto st = std::make_shared<op_state>(20);
  for (int i = 0; i < 20; ++i)
    e.submit(
        s, 0,
        [&](engine::done_fn done) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          done_ops.fetch_add(1);
          done(nullptr);
        },
        st);
  e.wait_slot(s);
  CHECK(done_ops.load() == 20);
  key_slot idle;
  e.wait_slot(idle);  // nothing issued on it: at once
}

// Ops over hundreds of keys let them go lazily (engine/key_slot.hpp's key_hold): their finish
// walks their keys only when an op waits behind them; otherwise each key goes free when touched.
TEST_CASE("an op over hundreds of keys: keys go free when touched, or at once when an op waits" *
          doctest::timeout(30)) {
  engine e(2);
  constexpr std::size_t n = 300;  // over the engine's lazy_release_keys
  named_ops r(n);
  auto& slots = r.slots;
  auto& order = r.order;
  auto st = std::make_shared<op_state>(5);
  // A completes at once: nothing waits, so its keys stay marked until touched.
  e.submit(std::span<key_slot* const>(r.all), 0, r.logged("A"), st);
  e.wait_all();
  CHECK(slots[7].issued == 1);
  CHECK(slots[7].completed == 0);  // not let go yet...
  CHECK_FALSE(slots[7].busy());    // ...but done
  e.wait_slot(slots[7]);           // a wait lets it go
  CHECK(slots[7].completed == 1);
  // B holds every key until told; C (one key) and D (all keys) queue behind it.
  engine::done_fn finish_b;
  std::promise<void> b_runs;
  e.submit(std::span<key_slot* const>(r.all), 0, r.logged("B", &finish_b, &b_runs), st);
  b_runs.get_future().wait();
  e.submit(slots[3], 0, r.logged("C"), st);
  e.submit(std::span<key_slot* const>(r.all), 0, r.logged("D"), st);
  {
    std::lock_guard lk(r.m);
    CHECK(order == std::vector<std::string>{"A", "B"});
  }
  CHECK(slots[3].busy());
  finish_b(nullptr);  // an op waits behind B: its finish walks the keys and lets C, then D, in
  e.wait_all();
  CHECK(order == std::vector<std::string>{"A", "B", "C", "D"});
  e.submit(slots[299], 0, r.logged("E"), st);  // D is done: its key goes free on this touch
  kvstore::op(st).wait();
  e.wait_all();
  CHECK(order.back() == "E");
  for (std::size_t k = 0; k < n; ++k) {
    e.wait_slot(slots[k]);
    CHECK(slots[k].completed == slots[k].issued);
    CHECK_FALSE(slots[k].busy());
  }
  CHECK(slots[3].issued == 4);
  CHECK(slots[299].issued == 4);
}

// The next op over exactly the keys of a done hold renews it (engine::renew): it touches no
// key's slot, and still orders with one-key ops and waits as a queued op would.
TEST_CASE("an op over the same hundreds of keys renews the done hold: order and waits kept" *
          doctest::timeout(30)) {
  named_ops r(300);  // over the engine's lazy_release_keys
  const std::size_t n = r.slots.size();
  auto st = std::make_shared<op_state>(6);
  engine e(2);
  e.submit(std::span<key_slot* const>(r.all), 0, r.logged("A"), st);
  e.wait_all();
  // B names the same keys in the same order: it renews A's hold, no slot touched.
  engine::done_fn finish_b;
  std::promise<void> b_runs;
  e.submit(std::span<key_slot* const>(r.all), 0, r.logged("B", &finish_b, &b_runs), st);
  b_runs.get_future().wait();
  for (std::size_t k = 0; k < n; ++k) CHECK(r.slots[k].issued == 1);
  CHECK(r.slots[5].busy());
  // A wait on a key, and a one-key op on it, both wait for B.
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    e.wait_slot(r.slots[9]);
    waited = true;
  });
  e.submit(r.slots[5], 0, r.logged("C"), st);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(waited.load());
  {
    std::lock_guard lk(r.m);
    CHECK(r.order == std::vector<std::string>{"A", "B"});
  }
  finish_b(nullptr);
  waiter.join();
  e.wait_all();
  CHECK(r.order == std::vector<std::string>{"A", "B", "C"});
  // C touched a key of B's hold: D over all keys queues on each of them again.
  e.submit(std::span<key_slot* const>(r.all), 0, r.logged("D"), st);
  e.wait_all();
  CHECK(r.slots[0].issued == 2);
  CHECK(r.slots[5].issued == 3);
  // The same keys in another order name another list: E queues on each key too.
  std::vector<key_slot*> reversed(r.all.rbegin(), r.all.rend());
  e.submit(std::span<key_slot* const>(reversed), 0, r.logged("E"), st);
  e.wait_all();
  CHECK(r.slots[0].issued == 3);
  // And F, over E's list, renews E's hold.
  e.submit(std::span<key_slot* const>(reversed), 0, r.logged("F"), st);
  kvstore::op(st).wait();
  e.wait_all();
  CHECK(r.slots[0].issued == 3);
  CHECK(r.order.back() == "F");
  for (std::size_t k = 0; k < n; ++k) {
    e.wait_slot(r.slots[k]);
    CHECK(r.slots[k].completed == r.slots[k].issued);
    CHECK_FALSE(r.slots[k].busy());
  }
}

TEST_CASE("ops over the same hundreds of keys, renewing, and one-key ops at random: order kept" *
          doctest::timeout(60)) {
  constexpr int keys = 400, ops = 800;
  std::mt19937 rng(11);
  std::vector<int> list;             // the many-key list, redrawn now and then
  std::vector<int> issued(keys, 0);  // per key: ops issued on it
  std::vector<key_slot> slots(keys);
  key_log_run run(keys);
  auto st = std::make_shared<op_state>(ops);
  engine e(4);
  for (int i = 0; i < ops; ++i) {
    std::vector<int> ks;
    if (i % 3 != 2) {  // mostly the same list of about 300 keys, as a training loop calls it
      if (list.empty() || rng() % 8 == 0) {
        list.clear();
        for (int k = 0; k < keys; ++k)
          if (rng() % 4 != 0) list.push_back(k);
      }
      ks = list;
    } else {
      ks.push_back(static_cast<int>(rng() % keys));
    }
    for (int k : ks) ++issued[static_cast<std::size_t>(k)];
    std::vector<key_slot*> ps;
    for (int k : ks) ps.push_back(&slots[static_cast<std::size_t>(k)]);
    e.submit(std::span<key_slot* const>(ps), 0,
             run.task(i, ks, i % 5 == 0, std::chrono::microseconds(200)), st, i % 2 == 0);
    if (i % 50 == 49) {
      const auto k = static_cast<std::size_t>(rng() % keys);
      e.wait_slot(slots[k]);
      CHECK_FALSE(slots[k].busy());
      std::lock_guard lk(run.m);
      CHECK(run.log[k].size() == static_cast<std::size_t>(issued[k]));
    }
    if (i % 7 == 0) e.wait_all();  // done holds, for the next call of the list to renew
  }
  kvstore::op(st).wait();
  run.join();
  e.wait_all();
  CHECK_FALSE(run.overlap.load());
  int renewed = 0;  // keys some op renewed a hold of: fewer ops queued on them than issued
  for (int k = 0; k < keys; ++k) {
    const auto& l = run.log[static_cast<std::size_t>(k)];
    CHECK(std::is_sorted(l.begin(), l.end()));
    CHECK(l.size() == static_cast<std::size_t>(issued[static_cast<std::size_t>(k)]));
    e.wait_slot(slots[static_cast<std::size_t>(k)]);
    CHECK_FALSE(slots[static_cast<std::size_t>(k)].busy());
    if (slots[static_cast<std::size_t>(k)].issued != static_cast<std::uint32_t>(issued[k]))
      ++renewed;
  }
  CHECK(renewed > 0);
}

TEST_CASE("ops over hundreds of keys and one-key ops at random: per-key order, waits exact" *
          doctest::timeout(60)) {
  engine e(4);
  constexpr int keys = 600, ops = 600;
  std::vector<key_slot> slots(keys);
  key_log_run run(keys);
  std::vector<int> issued(keys, 0);  // per key: ops issued on it (this thread)
  auto st = std::make_shared<op_state>(ops);
  std::mt19937 rng(7);
  for (int i = 0; i < ops; ++i) {
    std::vector<int> ks;
    if (i % 2 == 0) {  // about 300 of the 600 keys: let go lazily
      for (int k = 0; k < keys; ++k)
        if (rng() % 2 == 0) ks.push_back(k);
    } else {
      ks.push_back(static_cast<int>(rng() % keys));
    }
    for (int k : ks) ++issued[static_cast<std::size_t>(k)];
    std::vector<key_slot*> ps;
    for (int k : ks) ps.push_back(&slots[static_cast<std::size_t>(k)]);
    // i % 5 == 0: completes from another thread, after the task returned
    e.submit(std::span<key_slot* const>(ps), static_cast<int>(rng() % 3),
             run.task(i, ks, i % 5 == 0, std::chrono::microseconds(300)), st, i % 2 == 0);
    if (i % 40 == 39) {  // a wait on one key sees every op issued on it done
      const auto k = static_cast<std::size_t>(rng() % keys);
      e.wait_slot(slots[k]);
      CHECK_FALSE(slots[k].busy());
      std::lock_guard lk(run.m);
      CHECK(run.log[k].size() == static_cast<std::size_t>(issued[k]));
    }
  }
  kvstore::op(st).wait();
  run.join();
  e.wait_all();
  CHECK_FALSE(run.overlap.load());
  for (int k = 0; k < keys; ++k) {
    const auto& l = run.log[static_cast<std::size_t>(k)];
    auto& s = slots[static_cast<std::size_t>(k)];
    CHECK(std::is_sorted(l.begin(), l.end()));
    CHECK(l.size() == static_cast<std::size_t>(issued[static_cast<std::size_t>(k)]));
    CHECK_FALSE(s.busy());
    e.wait_slot(s);
    CHECK(s.completed == s.issued);
  }
}

// Pipelined ops (engine::submit_pipelined): the key goes to the next op when a task returns.
namespace {

// Completions a test hands out later, from its own thread.
struct deferred_dones {
  std::mutex m;
  std::vector<engine::done_fn> saved;
  void keep(engine::done_fn d) {
    std::lock_guard lk(m);
    saved.push_back(std::move(d));
  }
  std::size_t size() {
    std::lock_guard lk(m);
    return saved.size();
  }
  engine::done_fn take_first() {
    std::lock_guard lk(m);
    auto d = std::move(saved.front());
    saved.erase(saved.begin());
    return d;
  }
};

// Polls `cond` for up to 5 s.
template <class F>
bool eventually(F&& cond) {
  for (int i = 0; i < 5000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

}  // namespace

TEST_CASE("pipelined ops on a key start in issue order before the earlier ones complete" *
          doctest::timeout(30)) {
  engine e(2);
  e.set_max_pipeline(4);
  key_slot s;
  deferred_dones dones;
  std::vector<int> started;
  std::mutex m;
  std::vector<std::shared_ptr<op_state>> ops;
  for (int i = 0; i < 6; ++i) {
    ops.push_back(std::make_shared<op_state>(1));
    e.submit_pipelined(
        s, 0,
        [&, i](engine::done_fn d) {
          {
            std::lock_guard lk(m);
            started.push_back(i);
          }
          dones.keep(std::move(d));
        },
        ops.back());
  }
  // Four stream; the fifth waits for the oldest to complete.
  REQUIRE(eventually([&] { return dones.size() == 4; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(dones.size() == 4);
  for (auto& o : ops) CHECK_FALSE(kvstore::op(o).ready());
  dones.take_first()(nullptr);  // op 0 answered: op 4 may go, not op 5
  CHECK(kvstore::op(ops[0]).ready());
  REQUIRE(eventually([&] { return dones.size() == 4; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(dones.size() == 4);
  dones.take_first()(nullptr);
  REQUIRE(eventually([&] { return dones.size() == 4; }));
  {
    std::lock_guard lk(m);
    CHECK(started == std::vector<int>{0, 1, 2, 3, 4, 5});
  }
  CHECK(s.busy());
  while (dones.size()) dones.take_first()(nullptr);
  e.wait_slot(s);
  CHECK_FALSE(s.busy());
  for (auto& o : ops) CHECK(kvstore::op(o).ready());
}

TEST_CASE("an op that is not pipelined waits until every earlier one completed, and holds the key" *
          doctest::timeout(30)) {
  engine e(2);
  key_slot s;
  deferred_dones dones;
  std::atomic<int> plain_ran{0};
  std::atomic<bool> after_ran{false};
  for (int i = 0; i < 3; ++i)
    e.submit_pipelined(
        s, 0, [&](engine::done_fn d) { dones.keep(std::move(d)); }, nullptr);
  auto plain = std::make_shared<op_state>(1);
  e.submit(
      s, 0,
      [&](engine::done_fn d) {
        plain_ran = 1;
        dones.keep(std::move(d));
      },
      plain);
  auto after = std::make_shared<op_state>(1);
  e.submit_pipelined(
      s, 0,
      [&](engine::done_fn d) {
        after_ran = true;
        d(nullptr);  // done inside its task: it never streams
      },
      after);
  REQUIRE(eventually([&] { return dones.size() == 3; }));
  dones.take_first()(nullptr);
  dones.take_first()(nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(plain_ran == 0);  // one pipelined op still waits for its answer
  dones.take_first()(nullptr);
  REQUIRE(eventually([&] { return plain_ran == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK_FALSE(after_ran);  // the plain op holds the key until it completes
  dones.take_first()(nullptr);
  kvstore::op(after).wait();
  CHECK(after_ran);
  e.wait_slot(s);
  CHECK_FALSE(s.busy());
  CHECK(s.streaming == 0);
}

TEST_CASE("pipelined and plain ops at random: tasks in issue order, the limits kept" *
          doctest::timeout(60)) {
  engine e(3);
  e.set_max_pipeline(3);
  key_slot s;
  std::mutex m;
  std::vector<engine::done_fn> open;  // tasks that ran, not completed
  std::vector<int> open_priority;     // and their priorities
  std::vector<int> started;
  std::vector<bool> done_ops(400, false);
  bool violated = false;
  std::mt19937 rng(7);
  std::vector<bool> piped(400);
  for (auto&& p : piped) p = rng() % 3 != 0;
  std::atomic<bool> stop{false};
  // Completes open ops at random, oldest first (one connection answers in order).
  std::thread answerer([&] {
    std::mt19937 r(11);
    while (!stop) {
      engine::done_fn d;
      {
        std::lock_guard lk(m);
        if (!open.empty() && r() % 2) {
          d = std::move(open.front());
          open.erase(open.begin());
          open_priority.erase(open_priority.begin());
        }
      }
      if (d)
        d(nullptr);
      else
        std::this_thread::yield();
    }
  });
  auto st = std::make_shared<op_state>(400);
  for (int i = 0; i < 400; ++i) {
    auto task = [&, i](engine::done_fn d) {
      std::lock_guard lk(m);
      // In order; a plain op starts only once every earlier op is done; a pipelined one behind
      // fewer than 3 of its own priority.
      if (!started.empty() && started.back() != i - 1) violated = true;
      if (!piped[static_cast<std::size_t>(i)] && !open.empty()) violated = true;
      if (open.size() > 2) violated = true;
      for (int p : open_priority)
        if (p != (i / 8) % 4) violated = true;
      started.push_back(i);
      open_priority.push_back((i / 8) % 4);
      open.push_back([&, i, d = std::move(d)](std::exception_ptr e) {
        done_ops[static_cast<std::size_t>(i)] = true;
        d(e);
      });
    };
    if (piped[static_cast<std::size_t>(i)])
      e.submit_pipelined(s, (i / 8) % 4, task, st, i % 2 == 0);
    else
      e.submit(s, (i / 8) % 4, task, st, i % 2 == 0);
  }
  kvstore::op(st).wait();
  stop = true;
  answerer.join();
  e.wait_all();
  CHECK_FALSE(violated);
  CHECK(started.size() == 400);
  CHECK(std::all_of(done_ops.begin(), done_ops.end(), [](bool b) { return b; }));
  CHECK(s.streaming == 0);
  CHECK_FALSE(s.busy());
}

TEST_CASE("an answer that lets a queued pipelined op go runs it on the answering thread" *
          doctest::timeout(30)) {
  // A worker's io thread completes a streamed op: the op waiting behind the pipeline limit runs
  // there, not on a pool thread woken for it.
  engine e(2);
  e.set_max_pipeline(1);
  key_slot s;
  deferred_dones dones;
  auto first = std::make_shared<op_state>(1), second = std::make_shared<op_state>(1);
  e.submit_pipelined(
      s, 0, [&](engine::done_fn d) { dones.keep(std::move(d)); }, first);
  std::thread::id ran_on;
  e.submit_pipelined(
      s, 0,
      [&](engine::done_fn d) {
        ran_on = std::this_thread::get_id();
        d(nullptr);
      },
      second);
  REQUIRE(eventually([&] { return dones.size() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(kvstore::op(second).ready());  // behind the limit until the first is answered
  std::thread::id answered_on;
  std::thread answer([&] {
    answered_on = std::this_thread::get_id();
    dones.take_first()(nullptr);
  });
  answer.join();
  CHECK(kvstore::op(second).ready());  // it ran inside the answer
  CHECK(ran_on == answered_on);
  e.wait_slot(s);
}

TEST_CASE("ops run from an answer do not chain: one per answer, the rest on the pool" *
          doctest::timeout(60)) {
  // Tasks that complete at once (a request refused as it is sent) must not run the whole queue
  // on the answering thread, one inside the other's completion.
  engine e(1);
  e.set_max_pipeline(1);
  key_slot s;
  deferred_dones dones;
  constexpr int n = 2000;
  std::mutex m;
  std::vector<int> order;
  std::vector<std::thread::id> ran_on(n);
  auto head = std::make_shared<op_state>(1);
  e.submit_pipelined(
      s, 0, [&](engine::done_fn d) { dones.keep(std::move(d)); }, head);
  std::vector<std::shared_ptr<op_state>> ops;
  for (int i = 0; i < n; ++i) {
    ops.push_back(std::make_shared<op_state>(1));
    e.submit_pipelined(
        s, 0,
        [&, i](engine::done_fn d) {
          {
            std::lock_guard lk(m);
            order.push_back(i);
          }
          ran_on[static_cast<std::size_t>(i)] = std::this_thread::get_id();
          d(i % 3 == 0 ? std::make_exception_ptr(std::runtime_error("refused")) : nullptr);
        },
        ops.back());
  }
  REQUIRE(eventually([&] { return dones.size() == 1; }));
  std::thread::id answered_on;
  std::thread answer([&] {
    answered_on = std::this_thread::get_id();
    dones.take_first()(nullptr);
  });
  answer.join();
  e.wait_slot(s);
  CHECK(std::count(ran_on.begin(), ran_on.end(), answered_on) == 1);
  CHECK(ran_on[0] == answered_on);
  std::vector<int> want(n);
  for (int i = 0; i < n; ++i) want[static_cast<std::size_t>(i)] = i;
  CHECK(order == want);
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(kvstore::op(ops[static_cast<std::size_t>(i)]).ready());
    if (i % 3 == 0)
      CHECK_THROWS_AS(kvstore::op(ops[static_cast<std::size_t>(i)]).wait(), std::runtime_error);
  }
}
