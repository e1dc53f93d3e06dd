// The server's shard without a socket: requests are built by hand, answers land in an outbox per
// worker. Rounds, async apply, chunked and re-sent pushes, rows, optimizers, state transfer,
// snapshots, membership and errors, with exact values.
#include <kvstore/server/shard.hpp>  // first: the header is self-contained

#include <kvstore/server/snapshots.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/messages.hpp>
#include <kvstore/wire/meta.hpp>
#include <kvstore/wire/snapshot.hpp>

#include <doctest/doctest.h>

#include "support/shard_fixture.hpp"

#include <malloc.h>  // mallinfo2 (glibc)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

using namespace kvtest_shard;

TEST_CASE("a sync round sums every worker's push; acks wait for the round" * doctest::timeout(10)) {
  fixture f(3);
  f.init_all(1, {1, 2, 3, 4}, 0, 4, 4);
  CHECK(f.sh.slices().at(1).round == 0);
  f.push(0, 1, {1, 1, 1, 1}, 0, 4);
  f.push(1, 1, {2, 2, 2, 2}, 0, 4);
  CHECK(f.got(0).empty());
  CHECK(f.got(1).empty());
  // A pull while the round is gathered sees the last round's value (the worker's engine orders a
  // pull after its own push, whose ack only comes with the round).
  CHECK(f.pull(1, 4, 0, 2) == std::vector<float>{1, 2, 3, 4});
  f.push(2, 1, {3, 4, 5, 6}, 0, 4);
  for (int r = 0; r < 3; ++r) {
    REQUIRE(f.got(r).size() == 1);
    CHECK(f.got(r)[0].status == errc::ok);
  }
  CHECK(f.pull(1, 4) == std::vector<float>{6, 7, 8, 9});  // no optimizer: the sum is stored
  CHECK(f.sh.slices().at(1).round == 1);
  // The next round starts empty.
  f.push(0, 1, {1, 0, 0, 0}, 0, 4);
  f.push(1, 1, {0, 1, 0, 0}, 0, 4);
  f.push(2, 1, {0, 0, 1, 0}, 0, 4);
  CHECK(f.pull(1, 4) == std::vector<float>{1, 1, 1, 0});
}

TEST_CASE("a pull is answered in chunks of chunk_bytes, offsets absolute" * doctest::timeout(10)) {
  fixture f(1, true, 3 * sizeof(float));
  f.init_all(5, {1, 2, 3, 4, 5, 6, 7}, 10, 17, 20);
  CHECK(f.pull(5, 20, 10) == std::vector<float>{1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("a push in several frames: staged with two workers, read in place with one" *
          doctest::timeout(10)) {
  SUBCASE("two workers, frames interleaved") {
    fixture f(2);
    f.init_all(2, {0, 0, 0, 0, 0, 0}, 0, 6, 6);
    f.push(0, 2, {1, 1}, 0, 6, 0, false);
    f.push(1, 2, {10, 10, 10}, 3, 6, 0, false);
    f.push(0, 2, {2, 2, 2, 2}, 2, 6, 0, true);
    CHECK(f.got(0).empty());
    f.push(1, 2, {20, 20, 20}, 0, 6, 0, true);
    REQUIRE(f.got(0).size() == 1);
    REQUIRE(f.got(1).size() == 1);
    CHECK(f.pull(2, 6) == std::vector<float>{21, 21, 22, 12, 12, 12});
  }
  SUBCASE("one worker: the payload is read straight into the round's buffer") {
    fixture f(1);
    f.init_all(2, {0, 0, 0, 0}, 0, 4, 4);
    std::vector<float> a{1, 2}, b{3, 4};
    auto h1 = f.push_header(2, 0, 2, 4, 0, false);
    auto sink = f.sh.sink(0, h1);
    REQUIRE(sink.size() == 2 * sizeof(float));
    std::memcpy(sink.data(), a.data(), sink.size());
    f.sh.handle(0, f.port(0), h1, {}, sink);
    auto h2 = f.push_header(2, 2, 2, 4, 0, true);
    auto sink2 = f.sh.sink(0, h2);
    REQUIRE(sink2.size() == 2 * sizeof(float));
    std::memcpy(sink2.data(), b.data(), sink2.size());
    f.sh.handle(0, f.port(0), h2, {}, sink2);
    REQUIRE(f.got(0).size() == 1);
    CHECK(f.pull(2, 4) == std::vector<float>{1, 2, 3, 4});
    // With two workers in the group nothing is read in place.
    fixture g(2);
    g.init_all(2, {0, 0, 0, 0}, 0, 4, 4);
    CHECK(g.sh.sink(0, g.push_header(2, 0, 2, 4)).empty());
  }
}

TEST_CASE("async: each push is applied on arrival, one optimizer step per push" *
          doctest::timeout(10)) {
  fixture f(2, /*sync=*/false);
  f.init_all(3, {1, 1, 1, 1}, 0, 4, 4);
  f.push(0, 3, {5, 6, 7, 8}, 0, 4);
  REQUIRE(f.got(0).size() == 1);
  CHECK(f.pull(3, 4) == std::vector<float>{5, 6, 7, 8});  // no optimizer: stored
  optim::sgd o;
  o.learning_rate = 0.5;
  f.set_optimizer("sgd", params_of(o));
  // Worker 1 pushes in two frames (sequence 7): one step, both halves updated.
  f.push(1, 3, {2, 2}, 0, 4, 7, false);
  CHECK(f.got(1).empty());
  f.push(1, 3, {4, 4}, 2, 4, 7, true);
  REQUIRE(f.got(1).size() == 1);
  CHECK(f.pull(3, 4) == std::vector<float>{5 - 0.5f * 2, 6 - 0.5f * 2, 7 - 0.5f * 4, 8 - 0.5f * 4});
  CHECK(f.sh.slices().at(3).st_f.step == 1);
  CHECK(f.sh.slices().at(3).parts.empty());
  CHECK(f.sh.slices().at(3).applied.get(1) == 7);
}

TEST_CASE("sgd with momentum and adam on a sync round, values by hand" * doctest::timeout(10)) {
  SUBCASE("sgd, momentum") {
    fixture f(2);
    f.init_all(4, {1, 2}, 0, 2, 2);
    optim::sgd o;
    o.learning_rate = 0.1;
    o.momentum = 0.9;
    f.set_optimizer("sgd", params_of(o));
    const float lr = static_cast<float>(0.1), mu = static_cast<float>(0.9);
    std::vector<float> w{1, 2}, mom{0, 0};
    for (int step = 0; step < 3; ++step) {
      f.push(0, 4, {1, -1}, 0, 2);
      f.push(1, 4, {2, 3}, 0, 2);
      const float g[2] = {3, 2};
      for (int i = 0; i < 2; ++i) {
        mom[i] = mu * mom[i] - lr * g[i];
        w[i] += mom[i];
      }
      CHECK(f.pull(4, 2) == w);
    }
    CHECK(f.sh.slices().at(4).st_f.step == 3);
    CHECK(f.sh.slices().at(4).st_f.slots.at(0) == mom);
  }
  SUBCASE("adam") {
    fixture f(1);
    f.init_all(4, {1, -1, 0.5f}, 0, 3, 3);
    optim::adam o;
    o.learning_rate = 0.01;
    f.set_optimizer("adam", params_of(o));
    std::vector<float> w{1, -1, 0.5f}, m(3, 0), v(3, 0);
    const std::vector<float> grads[2] = {{0.5f, -2, 1}, {1, 1, -0.25f}};
    for (int t = 1; t <= 2; ++t) {
      f.push(0, 4, grads[t - 1], 0, 3);
      const float lr_t =
          static_cast<float>(0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t)));
      for (int i = 0; i < 3; ++i) {
        const float g = grads[t - 1][static_cast<std::size_t>(i)] + 0.0f * w[i];
        m[i] = 0.9f * m[i] + static_cast<float>(1 - 0.9) * g;
        v[i] = 0.999f * v[i] + static_cast<float>(1 - 0.999) * g * g;
        w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + 1e-8f);
      }
      CHECK(f.pull(4, 3) == w);
    }
    const auto& st = f.sh.slices().at(4).st_f;
    CHECK(st.step == 2);
    CHECK(st.slots.at(0) == m);
    CHECK(st.slots.at(1) == v);
  }
}

TEST_CASE("rows: a sync round of row pushes, duplicates summed, pull_rows" * doctest::timeout(10)) {
  fixture f(2);
  // Rows 2..4 of a 6 x 2 matrix live here (elements [4, 10)).
  f.init_all(6, {0, 0, 0, 0, 0, 0}, 4, 10, 12, 2);
  f.push_rows(0, 6, {2, 4, 2}, {1, 1, 2, 2, 3, 3}, 12);
  f.push_rows(1, 6, {3}, {5, 6}, 12);
  REQUIRE(f.got(0).size() == 1);
  CHECK(f.pull_rows(6, {4, 2, 3}, 12) == std::vector<float>{2, 2, 4, 4, 5, 6});
  CHECK(f.pull(6, 12, 4) == std::vector<float>{4, 4, 5, 6, 2, 2});
  SUBCASE("async rows: duplicates summed first") {
    fixture g(1, false);
    g.init_all(6, {1, 1, 1, 1, 1, 1}, 4, 10, 12, 2);
    g.push_rows(0, 6, {2, 2}, {1, 2, 3, 4}, 12);
    CHECK(g.pull(6, 12, 4) == std::vector<float>{4, 6, 1, 1, 1, 1});
  }
}

TEST_CASE("a worker that leaves completes the round; one that dies fails it" *
          doctest::timeout(10)) {
  fixture f(2);
  f.init_all(1, {0, 0}, 0, 2, 2);
  f.push(0, 1, {1, 2}, 0, 2);
  CHECK(f.got(0).empty());
  CHECK(f.sh.worker_left(1));
  CHECK_FALSE(f.sh.worker_left(1));
  REQUIRE(f.got(0).size() == 1);
  CHECK(f.got(0)[0].status == errc::ok);
  CHECK(f.pull(1, 2) == std::vector<float>{1, 2});
  // Alone now: the next push completes its round at once.
  f.push(0, 1, {3, 3}, 0, 2);
  REQUIRE(f.got(0).size() == 1);
  CHECK(f.pull(1, 2) == std::vector<float>{3, 3});

  fixture d(2);
  d.init_all(1, {0, 0}, 0, 2, 2);
  d.push(0, 1, {1, 2}, 0, 2);
  d.sh.worker_dead(1, "worker 1 (node 11) died");
  REQUIRE(d.got(0).size() == 1);
  CHECK(d.got(0)[0].status == errc::node_dead);
  CHECK(d.got(0)[0].message.find("worker 1 (node 11) died") != std::string::npos);
  CHECK(d.pull(1, 2) == std::vector<float>{0, 0});
  // Later rounds fail at once while the dead worker is in the group.
  d.push(0, 1, {1, 2}, 0, 2);
  REQUIRE(d.got(0).size() == 1);
  CHECK(d.got(0)[0].status == errc::node_dead);
}

TEST_CASE("a worker that left cannot push into rounds: refused, nothing changes" *
          doctest::timeout(10)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    fixture f(2, sync);
    f.init_all(1, {0, 0}, 0, 2, 2);
    f.init_all(2, {0, 0, 0, 0}, 0, 4, 4, 2);
    CHECK(f.sh.worker_left(1));
    auto refused = [&](auto&& push) {
      try {
        push();
        FAIL("a push from a worker that left was taken");
      } catch (const kvstore::error& e) {
        CHECK(code_of(e) == errc::invalid_argument);
        const std::string msg = e.what();
        CHECK(msg.find("worker 1") != std::string::npos);
        CHECK(msg.find("left the sync group") != std::string::npos);
        return msg;
      }
      return std::string();
    };
    CHECK(refused([&] { f.push(1, 1, {100, 100}, 0, 2); }).find("key 1") != std::string::npos);
    CHECK(refused([&] {
            f.push_rows(1, 2, {1}, {100, 100}, 4);
          }).find("key 2") != std::string::npos);
    CHECK(f.got(1).empty());
    CHECK(f.pull(1, 2) == std::vector<float>{0, 0});
    CHECK(f.pull(2, 4) == std::vector<float>{0, 0, 0, 0});
    // The worker still in the group: its pushes alone make the values, exactly.
    f.push(0, 1, {1, 2}, 0, 2);
    REQUIRE(f.got(0).size() == 1);
    CHECK(f.got(0)[0].status == errc::ok);
    CHECK(f.pull(1, 2) == std::vector<float>{1, 2});
    // And the direct sink (one worker left in the group) never reads its payload in place.
    CHECK(f.sh.sink(1, f.push_header(1, 0, 2, 2)).empty());
  }
}

TEST_CASE("inits: others wait for rank 0's value; a death of rank 0 fails them" *
          doctest::timeout(10)) {
  fixture f(2);
  f.init(1, 9, {}, 0, 2, 2);
  CHECK(f.got(1).empty());
  f.init(0, 9, {7, 8}, 0, 2, 2);
  REQUIRE(f.got(1).size() == 1);
  REQUIRE(f.got(0).size() == 1);
  CHECK(f.changes == std::vector<bool>{true});
  CHECK(error_of([&] { f.init(0, 9, {7, 8}, 0, 2, 2); }) == errc::already_inited);

  fixture d(2);
  d.init(1, 9, {}, 0, 2, 2);
  d.sh.worker_dead(0, "worker 0 died");
  REQUIRE(d.got(1).size() == 1);
  CHECK(d.got(1)[0].status == errc::node_dead);
}

TEST_CASE("optimizer states: save, load into a twin, the same bytes again" * doctest::timeout(10)) {
  fixture a(1), b(1);
  for (auto* f : {&a, &b}) {
    f->init_all(1, {1, 2, 3}, 0, 3, 3);
    f->init_all(2, {4, 5}, 2, 4, 6);
    optim::adam o;
    f->set_optimizer("adam", params_of(o));
  }
  a.push(0, 1, {1, 1, 1}, 0, 3);
  a.push(0, 2, {1, -1}, 2, 6);
  a.push(0, 2, {2, 2}, 2, 6);
  const auto saved_and_count = a.save_states();
  const auto& saved = saved_and_count.first;
  const auto count = saved_and_count.second;
  CHECK(count == 2);
  CHECK(a.saved_for == "adam");
  auto entries = wire::decode_states(saved);
  REQUIRE(entries.size() == 2);
  b.load_states(saved);
  REQUIRE(b.got(0).size() == 1);
  CHECK(b.got(0)[0].status == errc::ok);
  CHECK(b.save_states().first.size() == saved.size());
  CHECK(b.sh.slices().at(2).st_f.step == 2);
  CHECK(b.sh.slices().at(2).st_f.slots == a.sh.slices().at(2).st_f.slots);
  CHECK(b.sh.slices().at(1).st_f.slots == a.sh.slices().at(1).st_f.slots);
  // States saved for another optimizer are refused whole, naming both.
  b.got(0).clear();
  try {
    b.load_states(saved, "sgd");
    FAIL("states saved for sgd loaded into adam");
  } catch (const kvstore::error& e) {
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(std::string(e.what()).find("\"sgd\"") != std::string::npos);
    CHECK(std::string(e.what()).find("\"adam\"") != std::string::npos);
  }

  // States that do not fit a slice change nothing.
  fixture c(1);
  c.init_all(1, {1, 2, 3}, 0, 3, 3);
  c.init_all(2, {4, 5, 6}, 0, 3, 3);  // another range than the saved one
  CHECK(error_of([&] { c.load_states(saved); }) == errc::size_mismatch);
  CHECK(c.sh.slices().at(1).st_f.slots.empty());
  CHECK(c.sh.slices().at(1).st_f.step == 0);
  fixture e(1);
  e.init_all(1, {1, 2, 3}, 0, 3, 3);
  CHECK(error_of([&] { e.load_states(saved); }) == errc::unknown_key);
  CHECK(e.sh.slices().at(1).st_f.slots.empty());
}

TEST_CASE("snapshot round trip: take, encode, decode, restore serves the same" *
          doctest::timeout(10)) {
  fixture a(2);
  a.init_all(1, {1, 2, 3, 4}, 0, 4, 4);
  a.init_all(3, {0, 0, 0, 0}, 4, 8, 8, 2);
  optim::sgd o;
  o.learning_rate = 0.25;
  o.momentum = 0.5;
  a.set_optimizer("sgd", params_of(o));
  a.set_key_options(3, 8, 2.0, 0.5);
  a.push(0, 1, {1, 1, 1, 1}, 0, 4, 1);
  a.push(1, 1, {1, 2, 3, 4}, 0, 4, 1);
  a.push_rows(0, 3, {3}, {1, 1}, 8, 2);
  a.push_rows(1, 3, {2}, {2, 2}, 8, 2);
  const auto snap = kvstore::detail::take_snapshot(a.sh, 0);
  const std::string file = wire::encode_snapshot(snap);
  const auto back = wire::decode_snapshot(file, "test");

  fixture b(2);
  kvstore::detail::restore_snapshot(b.sh, back, 2);
  CHECK(b.pull(1, 4) == a.pull(1, 4));
  CHECK(b.pull(3, 8, 4) == a.pull(3, 8, 4));
  CHECK(b.sh.optimizer_name() == "sgd");
  CHECK(b.sh.slices().at(1).round == 1);
  CHECK(b.sh.slices().at(1).st_f.slots == a.sh.slices().at(1).st_f.slots);
  CHECK(b.sh.slices().at(3).mult.lr == 2.0);  // the key's multipliers survive a restart
  CHECK(b.sh.slices().at(3).mult.wd == 0.5);
  CHECK(b.sh.slices().at(1).mult.lr == 1.0);
  // The same bytes again, slices in key order (a hash map's order is its own).
  auto by_key = [](wire::shard_snapshot s) {
    std::sort(s.slices.begin(), s.slices.end(), [](auto& x, auto& y) { return x.key < y.key; });
    return wire::encode_snapshot(s);
  };
  CHECK(by_key(kvstore::detail::take_snapshot(b.sh, 0)) == by_key(snap));
  // A re-sent init is answered; a re-sent push that the snapshot holds is acknowledged, not summed.
  b.init(1, 1, {}, 0, 4, 4);
  REQUIRE(b.got(1).size() == 1);
  b.push(0, 1, {100, 100, 100, 100}, 0, 4, 1);
  REQUIRE(b.got(0).size() == 1);
  CHECK(b.got(0)[0].status == errc::ok);
  CHECK(b.pull(1, 4) == a.pull(1, 4));
  CHECK(b.sh.slices().at(1).round_done.empty());
}

TEST_CASE("exactly once: an async push re-sent after a restart mid-push" * doctest::timeout(10)) {
  fixture a(1, false);
  a.init_all(1, {0, 0, 0}, 0, 3, 3);
  optim::sgd o;
  o.learning_rate = 1;
  a.set_optimizer("sgd", params_of(o));
  // Push 4 in three frames; the snapshot is taken after two.
  a.push(0, 1, {1}, 0, 3, 4, false);
  a.push(0, 1, {2}, 1, 3, 4, false);
  const auto file = wire::encode_snapshot(kvstore::detail::take_snapshot(a.sh, 0));

  fixture b(1, false);
  kvstore::detail::restore_snapshot(b.sh, wire::decode_snapshot(file, "test"), 1);
  CHECK(b.pull(1, 3) == std::vector<float>{-1, -2, 0});
  // The worker re-sends the whole push on its new connection.
  b.sh.connection_lost(0);
  b.push(0, 1, {1}, 0, 3, 4, false);
  b.push(0, 1, {2}, 1, 3, 4, false);
  CHECK(b.pull(1, 3) == std::vector<float>{-1, -2, 0});  // skipped: applied before
  b.push(0, 1, {3}, 2, 3, 4, true);
  REQUIRE(b.got(0).size() == 1);
  CHECK(b.pull(1, 3) == std::vector<float>{-1, -2, -3});
  CHECK(b.sh.slices().at(1).st_f.step == 1);  // one step for the whole push
  // Re-sent once more (its answer was lost): acknowledged, not applied.
  b.push(0, 1, {3}, 2, 3, 4, true);
  CHECK(b.pull(1, 3) == std::vector<float>{-1, -2, -3});
  // The next push applies.
  b.push(0, 1, {1, 1, 1}, 0, 3, 5, true);
  CHECK(b.pull(1, 3) == std::vector<float>{-2, -3, -4});
}

TEST_CASE("bad requests throw the right error and change nothing" * doctest::timeout(10)) {
  fixture f(1);
  f.init_all(1, {1, 2, 3, 4}, 2, 6, 8);
  f.init_all(2, {1, 2, 3, 4}, 0, 4, 4);  // no row length
  const std::vector<float> before{1, 2, 3, 4};
  CHECK(error_of([&] { f.push(0, 1, {1, 1, 1}, 4, 8); }) == errc::size_mismatch);  // past the slice
  CHECK(error_of([&] { f.push(0, 1, {1}, 0, 8); }) == errc::size_mismatch);        // before it
  CHECK(error_of([&] { f.push(0, 1, {1}, 2, 9); }) == errc::size_mismatch);        // wrong total
  CHECK(error_of([&] { f.push(0, 7, {1}, 0, 8); }) == errc::unknown_key);
  CHECK(error_of([&] { f.push_rows(0, 2, {0}, {1, 1, 1, 1}, 4); }) == errc::not_a_matrix);
  CHECK(error_of([&] { f.init(0, 1, {1}, 2, 6, 9); }) ==
        errc::size_mismatch);  // re-init, other size
  CHECK(error_of([&] { f.init(0, 8, {1}, 3, 2, 4); }) == errc::invalid_argument);  // lo > hi
  {
    wire::header h = f.push_header(1, 2, 1, 8);
    h.type = wire::dtype::f64;
    CHECK(error_of([&] { f.sh.handle(0, f.port(0), h, {}, {}); }) == errc::invalid_argument);
  }
  CHECK(error_of([&] { f.set_optimizer("no such optimizer", ""); }) == errc::invalid_argument);
  CHECK(f.sh.optimizer_name().empty());
  // A frame bigger than its key's slice is a protocol error before anything is read.
  CHECK(error_of([&] { (void)f.sh.sink(0, f.push_header(1, 2, 5, 8)); }) == errc::protocol);
  CHECK(error_of([&] { (void)f.sh.sink(0, f.push_header(7, 0, 1, 8)); }) == errc::protocol);
  CHECK(f.pull(1, 8, 2) == before);
  CHECK(f.pull(2, 4) == before);
  CHECK(f.sh.slices().at(1).round_done.empty());
  CHECK(f.sh.slices().count(8) == 0);

  fixture r(1);
  r.init_all(6, {0, 0, 0, 0}, 4, 8, 12, 2);  // rows 2 and 3
  CHECK(error_of([&] { r.push_rows(0, 6, {1}, {1, 1}, 12); }) == errc::row_out_of_range);
  CHECK(error_of([&] { r.push_rows(0, 6, {4}, {1, 1}, 12); }) == errc::row_out_of_range);
  CHECK(error_of([&] { r.push_rows(0, 6, {2}, {1, 1, 1}, 12); }) == errc::size_mismatch);
  CHECK(error_of([&] { r.pull_rows(6, {0}, 12); }) == errc::row_out_of_range);
  CHECK(r.pull(6, 12, 4) == std::vector<float>{0, 0, 0, 0});
  CHECK(r.sh.slices().at(6).round_done.empty());
}

TEST_CASE("limits: an init past max_keys or max_total_bytes is refused before it allocates" *
          doctest::timeout(10)) {
  auto c = fixture::config(1, true, 1 << 20);
  c.max_keys = 2;
  const std::uint64_t four_floats = 16 + shard_t::key_overhead_bytes;
  c.max_total_bytes = 2 * four_floats + 8;  // two keys of 4 floats, and 8 bytes to spare
  fixture f(c);
  f.init_all(1, {1, 2, 3, 4}, 0, 4, 4);
  auto message = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const kvstore::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      return e.what();
    }
    FAIL("no error");
    return {};
  };
  // 7 floats cost 28 bytes and the overhead; 16 and the overhead and 8 are left.
  const auto too_big = message([&] { f.init(0, 2, std::vector<float>(7, 1.0f), 0, 7, 7); });
  CHECK(too_big.find("max_total_bytes") != std::string::npos);
  CHECK(too_big.find("key 2") != std::string::npos);
  CHECK(f.sh.slices().count(2) == 0);
  f.init_all(2, {5, 6, 7, 8}, 0, 4, 4);  // fits: the refusal took nothing
  const auto too_many = message([&] { f.init(0, 3, {1}, 0, 1, 1); });
  CHECK(too_many.find("max_keys") != std::string::npos);
  CHECK(f.sh.slices().count(3) == 0);
  CHECK(f.pull(1, 4) == std::vector<float>{1, 2, 3, 4});
  CHECK(f.pull(2, 4) == std::vector<float>{5, 6, 7, 8});
}

// What max_total_bytes counts a key is what it costs: the heap a server's shard grows by over
// many inits (glibc's count of bytes in use, mmapped blocks included) is at most the count, and
// not far under it. (Not under a sanitizer: its allocator keeps its own books.)
TEST_CASE("max_total_bytes counts a key what it costs the server" * doctest::timeout(30)) {
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVTEST_OWN_ALLOCATOR 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(__GLIBC__)
#define KVTEST_OWN_ALLOCATOR 1
#endif
#ifdef KVTEST_OWN_ALLOCATOR
  MESSAGE("skipped: a sanitizer's allocator, or no glibc, keeps books mallinfo2 does not read");
#else
  constexpr std::uint64_t keys = 20000, floats = 8;  // 32 bytes: a buffer of its own
  fixture f(1);
  const std::vector<float> value(floats, 1.0f);
  f.init_all(0, value, 0, floats, floats);  // the fixture's own buffers made
  auto in_use = [] {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<double>(m.uordblks + m.hblkhd);
  };
  const double before = in_use();
  for (std::uint64_t k = 1; k <= keys; ++k) f.init_all(k, value, 0, floats, floats);
  const double per_key = (in_use() - before) / keys;
  const double counted = floats * sizeof(float) + shard_t::key_overhead_bytes;
  MESSAGE("a key of 8 floats: " << per_key << " bytes of heap, counted " << counted);
  CHECK(per_key <= counted);
  CHECK(per_key >= 0.75 * counted);
#endif
}

TEST_CASE("pull_rows naming a row twice is refused: an answer is never bigger than the slice" *
          doctest::timeout(10)) {
  fixture r(1);
  r.init_all(6, {1, 1, 2, 2}, 4, 8, 12, 2);  // rows 2 and 3
  try {
    r.pull_rows(6, {2, 3, 2}, 12);
    FAIL("no error");
  } catch (const kvstore::error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("row 2") != std::string::npos);
  }
  CHECK(r.got(0).empty());  // nothing was answered
  CHECK(r.pull_rows(6, {3, 2}, 12) == std::vector<float>{2, 2, 1, 1});
}

TEST_CASE("an optimizer set again: the same type keeps its state, another starts fresh" *
          doctest::timeout(10)) {
  fixture f(1, /*sync=*/false);
  f.init_all(1, {0, 0}, 0, 2, 2);
  optim::sgd o{.learning_rate = 1, .momentum = 0.5};
  f.set_optimizer("sgd", params_of(o));
  f.push(0, 1, {1, 1}, 0, 2);  // mom = -1, w = -1
  CHECK(f.pull(1, 2) == std::vector<float>{-1, -1});
  // A learning-rate schedule: sgd again with lr 0.5. The momentum carries on:
  // mom = 0.5 * -1 - 0.5 * 1 = -1, w = -2. Reset, it would be -0.5 and w = -1.5.
  o.learning_rate = 0.5;
  f.set_optimizer("sgd", params_of(o));
  f.push(0, 1, {1, 1}, 0, 2);
  CHECK(f.pull(1, 2) == std::vector<float>{-2, -2});
  CHECK(f.sh.slices().at(1).st_f.step == 2);
  // Every worker setting the same optimizer again changes nothing either.
  f.set_optimizer("sgd", params_of(o));
  CHECK(f.sh.slices().at(1).st_f.step == 2);
  // Another type starts fresh: adagrad's history, step 1.
  f.set_optimizer("adagrad", params_of(optim::adagrad{.learning_rate = 1}));
  CHECK(f.sh.slices().at(1).st_f.slots.empty());
  f.push(0, 1, {1, 1}, 0, 2);
  CHECK(f.sh.slices().at(1).st_f.step == 1);
}

TEST_CASE("a key's multipliers scale its learning rate and weight decay; add accumulates" *
          doctest::timeout(10)) {
  fixture f(2);  // dist_sync: two workers' pushes summed, applied once
  f.init_all(1, {1, 1}, 0, 2, 2);
  f.init_all(2, {1, 1}, 0, 2, 2);
  f.set_optimizer("sgd", params_of(optim::sgd{.learning_rate = 0.1, .weight_decay = 0.5}));
  f.set_key_options(2, 2, 2.0, 0.0);
  for (std::uint64_t k : {1, 2}) {
    f.push(0, k, {1, 1}, 0, 2);
    f.push(1, k, {1, 1}, 0, 2);
  }
  // key 1: w = 1 - 0.1 * (2 + 0.5 * 1) = 0.75; key 2 (lr x2, no decay): 1 - 0.2 * 2 = 0.6.
  CHECK(f.pull(1, 2) == std::vector<float>{0.75f, 0.75f});
  CHECK(f.pull(2, 2) == std::vector<float>{0.6f, 0.6f});
  CHECK(error_of([&] {
          wire::header h = wire::key_options_header({9, 2, wire::dtype::f32});
          f.sh.handle(0, f.port(0), h, wire::encode_key_multipliers({1, 1}), {});
        }) == errc::unknown_key);
  // Multiverso's default updater: each round's sum is added to the value.
  f.set_optimizer("add", params_of(optim::add{}));
  f.push(0, 1, {1, 2}, 0, 2);
  f.push(1, 1, {3, 4}, 0, 2);
  CHECK(f.pull(1, 2) == std::vector<float>{4.75f, 6.75f});
}

// ---- versions and bounded staleness -----------------------------------------------------------

namespace {

kvstore::detail::shard_config versioned(int workers, bool sync,
                                        std::optional<std::uint64_t> staleness = std::nullopt) {
  auto c = fixture::config(workers, sync, 1 << 20);
  c.staleness = staleness;
  c.hold_timeout = std::chrono::milliseconds(1000);
  return c;
}

/// The response to request `req_id` in `rank`'s outbox, taken out of it.
std::optional<answer> response_to(fixture& f, int rank, std::uint64_t req_id) {
  auto& g = f.got(rank);
  for (auto it = g.begin(); it != g.end(); ++it)
    if (!it->data && it->h.req_id == req_id) {
      answer a = *it;
      g.erase(it);
      return a;
    }
  return std::nullopt;
}

}  // namespace

TEST_CASE("versions: sync rounds completed, async pushes applied, a re-sent push counted once" *
          doctest::timeout(10)) {
  SUBCASE("dist_sync") {
    fixture f(2);
    f.init_all(1, {0, 0}, 0, 2, 2);
    CHECK(f.version(1, 2) == 0);
    f.push(0, 1, {1, 1}, 0, 2, 1);
    CHECK(f.version(1, 2) == 0);  // the round is not complete
    f.push(1, 1, {2, 2}, 0, 2, 1);
    CHECK(f.version(1, 2) == 1);
    f.push(0, 1, {1, 1}, 0, 2, 2);
    f.push(1, 1, {1, 1}, 0, 2, 2);
    CHECK(f.version(1, 2, 1) == 2);
  }
  SUBCASE("dist_async") {
    fixture f(2, false);
    f.init_all(1, {0, 0, 0, 0}, 0, 4, 4);
    f.push(0, 1, {1, 1, 1, 1}, 0, 4, 1);
    f.push(1, 1, {1, 1, 1, 1}, 0, 4, 1);
    // A push in two frames counts once, when its last frame is applied.
    f.push(0, 1, {2, 2}, 0, 4, 2, false);
    CHECK(f.version(1, 4) == 2);
    f.push(0, 1, {2, 2}, 2, 4, 2, true);
    CHECK(f.version(1, 4) == 3);
    CHECK(error_of([&] { f.push_rows(0, 1, {}, {}, 4, 3); }) == errc::not_a_matrix);
    CHECK(f.version(1, 4) == 3);
    // Restored from a snapshot: a push the snapshot holds, re-sent, is not counted again.
    fixture b(2, false);
    kvstore::detail::restore_snapshot(
        b.sh,
        wire::decode_snapshot(wire::encode_snapshot(kvstore::detail::take_snapshot(f.sh, 0)),
                              "test"),
        2);
    CHECK(b.version(1, 4) == 3);
    b.push(0, 1, {9, 9, 9, 9}, 0, 4, 2);
    CHECK(b.version(1, 4) == 3);
    b.push(1, 1, {5, 5, 5, 5}, 0, 4, 2);
    CHECK(b.version(1, 4) == 4);
  }
}

TEST_CASE("a version request for a key never inited: unknown_key naming it, nothing changes" *
          doctest::timeout(10)) {
  fixture f(1, false);
  f.init_all(1, {1, 2}, 0, 2, 2);
  wire::header h;
  h.command = wire::cmd::version;
  h.key = 9;
  h.type = wire::dtype::f32;
  h.total = 2;
  try {
    f.sh.handle(0, f.port(0), h, {}, {});
    FAIL("no error");
  } catch (const kvstore::error& e) {
    CHECK(code_of(e) == errc::unknown_key);
    CHECK(std::string(e.what()).find("key 9") != std::string::npos);
  }
  h.key = 1;
  h.total = 3;  // another size than the key's
  CHECK(error_of([&] { f.sh.handle(0, f.port(0), h, {}, {}); }) == errc::size_mismatch);
  CHECK(f.sh.slices().count(9) == 0);
  CHECK(f.version(1, 2) == 0);
  CHECK(f.pull(1, 2) == std::vector<float>{1, 2});
}

TEST_CASE("min_version: a pull is held until its slice reaches the version, then answered" *
          doctest::timeout(10)) {
  SUBCASE("dist_sync: answered when the round completes") {
    fixture f(versioned(2, true));
    f.init_all(1, {0, 0}, 0, 2, 2);
    const auto q = f.send_pull(1, 1, 2, 1);
    CHECK(f.answer_of(1, q).empty());
    CHECK(f.sh.held() == 1);
    f.push(0, 1, {1, 2}, 0, 2, 1);
    CHECK(f.answer_of(1, q).empty());
    f.push(1, 1, {10, 20}, 0, 2, 1);
    CHECK(f.answer_of(1, q) == std::vector<float>{11, 22});
    CHECK(f.sh.held() == 0);
    // A version reached already is answered at once.
    CHECK(f.answer_of(0, f.send_pull(0, 1, 2, 1)) == std::vector<float>{11, 22});
  }
  SUBCASE("dist_async: answered by the push that reaches it") {
    fixture f(versioned(2, false));
    f.init_all(1, {0, 0}, 0, 2, 2);
    optim::sgd o;
    o.learning_rate = -1;  // w += g
    f.set_optimizer("sgd", params_of(o));
    const auto q = f.send_pull(1, 1, 2, 2);
    f.push(0, 1, {1, 1}, 0, 2, 1);
    CHECK(f.answer_of(1, q).empty());
    f.push(0, 1, {2, 3}, 0, 2, 2);
    CHECK(f.answer_of(1, q) == std::vector<float>{3, 4});
  }
  SUBCASE("pull_rows waits too") {
    fixture f(versioned(1, false));
    f.init_all(6, {0, 0, 0, 0}, 0, 4, 4, 2);
    wire::header h;
    h.command = wire::cmd::pull_rows;
    h.key = 6;
    h.req_id = 77;
    h.type = wire::dtype::f32;
    h.total = 4;
    h.aux = 1;
    const std::int64_t rows[] = {1};
    f.sh.handle(0, f.port(0), h, wire::encode_rows(rows, 1), {});
    CHECK(f.answer_of(0, 77).empty());
    f.push_rows(0, 6, {1}, {5, 6}, 4, 1);
    CHECK(f.answer_of(0, 77) == std::vector<float>{5, 6});
  }
}

TEST_CASE("held pulls: a deadline fails them naming key and version; bounded per worker" *
          doctest::timeout(10)) {
  auto c = versioned(2, false);
  c.max_held_pulls = 2;
  fixture f(c);
  f.init_all(1, {0, 0}, 0, 2, 2);
  f.init_all(2, {0, 0}, 0, 2, 2);
  const auto q = f.send_pull(0, 1, 2, 5);
  f.send_pull(0, 2, 2, 1);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(f.sh.expire_held(start).has_value());  // not yet: still held
  CHECK(f.got(0).empty());
  // A third pull of worker 0 is over its limit: refused, naming the limit; worker 1 still holds.
  try {
    f.send_pull(0, 1, 2, 7);
    FAIL("a third held pull was taken");
  } catch (const kvstore::error& e) {
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(std::string(e.what()).find("KVSTORE_MAX_HELD_PULLS") != std::string::npos);
  }
  CHECK(f.sh.held(0) == 2);
  const auto q1 = f.send_pull(1, 1, 2, 9);
  CHECK(f.sh.held(1) == 1);
  f.push(1, 2, {4, 4}, 0, 2, 1);  // key 2 reaches version 1: that pull is answered
  CHECK(f.sh.held(0) == 1);
  // Past the deadline: timeouts naming the key, the version and where the slice is.
  CHECK_FALSE(f.sh.expire_held(start + std::chrono::seconds(2)).has_value());
  auto a = response_to(f, 0, q);
  REQUIRE(a);
  CHECK(a->status == errc::timeout);
  CHECK(a->message.find("key 1 waited for version 5") != std::string::npos);
  CHECK(a->message.find("at version 0") != std::string::npos);
  REQUIRE(response_to(f, 1, q1));
  CHECK(f.sh.held() == 0);
  // A lost connection drops its worker's held pulls unanswered.
  const auto lost = f.send_pull(1, 1, 2, 3);
  f.sh.connection_lost(1);
  CHECK(f.sh.held() == 0);
  f.push(0, 1, {1, 1}, 0, 2, 1);
  f.push(0, 1, {1, 1}, 0, 2, 2);
  f.push(0, 1, {1, 1}, 0, 2, 3);
  CHECK(f.answer_of(1, lost).empty());
  CHECK_FALSE(response_to(f, 1, lost));
}

TEST_CASE("bounded staleness: a worker too far ahead waits; within the bound it proceeds" *
          doctest::timeout(10)) {
  fixture f(versioned(3, false, 1));
  f.init_all(1, {0, 0}, 0, 2, 2);
  optim::sgd o;
  o.learning_rate = -1;  // w += g
  f.set_optimizer("sgd", params_of(o));
  f.push(0, 1, {1, 1}, 0, 2, 1);
  // One push ahead of workers 1 and 2: within staleness 1, answered at once.
  CHECK(f.answer_of(0, f.send_pull(0, 1, 2)) == std::vector<float>{1, 1});
  f.push(0, 1, {1, 1}, 0, 2, 2);
  // Two ahead: waits for both.
  const auto q = f.send_pull(0, 1, 2);
  CHECK(f.answer_of(0, q).empty());
  f.push(1, 1, {10, 10}, 0, 2, 1);
  CHECK(f.answer_of(0, q).empty());  // worker 2 still lags by 2
  // Workers behind or level are never held.
  CHECK(f.answer_of(1, f.send_pull(1, 1, 2)) == std::vector<float>{12, 12});
  f.push(2, 1, {100, 100}, 0, 2, 1);
  CHECK(f.answer_of(0, q) == std::vector<float>{112, 112});

  SUBCASE("a deadline names the worker that held it back") {
    f.push(0, 1, {1, 1}, 0, 2, 3);  // 3 pushes against 1 and 1
    const auto r = f.send_pull(0, 1, 2);
    f.sh.expire_held(std::chrono::steady_clock::now() + std::chrono::seconds(2));
    auto a = response_to(f, 0, r);
    REQUIRE(a);
    CHECK(a->status == errc::timeout);
    CHECK(a->message.find("key 1 waited for worker 1, which pushed it 1 times, more than "
                          "staleness 1 behind worker 0's 3") != std::string::npos);
  }
  SUBCASE("a worker that leaves or dies holds no one back") {
    f.push(0, 1, {1, 1}, 0, 2, 3);
    const auto r = f.send_pull(0, 1, 2);
    CHECK(f.sh.worker_left(1));
    CHECK(f.answer_of(0, r).empty());  // worker 2 still lags
    f.sh.worker_dead(2, "worker 2 (node 13) died");
    CHECK(f.answer_of(0, r) == std::vector<float>{113, 113});
    CHECK(f.sh.held() == 0);
  }
}

TEST_CASE("staleness 0: every read sees all workers' pushes up to its own count" *
          doctest::timeout(10)) {
  fixture f(versioned(2, false, 0));
  f.init_all(1, {0}, 0, 1, 1);
  f.push(0, 1, {1}, 0, 1, 1);
  const auto q = f.send_pull(0, 1, 1);
  CHECK(f.answer_of(0, q).empty());
  f.push(1, 1, {2}, 0, 1, 1);
  CHECK(f.answer_of(0, q) == std::vector<float>{2});  // no optimizer: the last push is stored

  SUBCASE("dist_sync ignores staleness: no worker is ever ahead") {
    fixture s(versioned(2, true, 0));
    s.init_all(1, {0}, 0, 1, 1);
    s.push(0, 1, {1}, 0, 1, 1);
    // Worker 1 is a push behind, yet its pull is answered: only a worker's own open push waits.
    CHECK(s.answer_of(1, s.send_pull(1, 1, 1)) == std::vector<float>{0});
  }
  SUBCASE("dist_sync: a worker dying fails a pull waiting for a version") {
    fixture s(versioned(2, true));
    s.init_all(1, {0}, 0, 1, 1);
    const auto r = s.send_pull(0, 1, 1, 1);
    s.sh.worker_dead(1, "worker 1 (node 11) died");
    auto a = response_to(s, 0, r);
    REQUIRE(a);
    CHECK(a->status == errc::node_dead);
    CHECK(a->message.find("version 1") != std::string::npos);
    CHECK(a->message.find("worker 1 (node 11) died") != std::string::npos);
  }
}

TEST_CASE("snapshots keep versions; an async snapshot from before versions recovers its count" *
          doctest::timeout(10)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    fixture a(1, sync);
    a.init_all(1, {0, 0}, 0, 2, 2);
    for (std::uint64_t q = 1; q <= 3; ++q) a.push(0, 1, {1, 1}, 0, 2, q);
    CHECK(a.version(1, 2) == 3);
    const auto file = wire::encode_snapshot(kvstore::detail::take_snapshot(a.sh, 0));
    fixture b(1, sync);
    kvstore::detail::restore_snapshot(b.sh, wire::decode_snapshot(file, "test"), 1);
    CHECK(b.version(1, 2) == 3);
    b.push(0, 1, {1, 1}, 0, 2, 4);
    CHECK(b.version(1, 2) == 4);
  }
  // Written before async slices counted pushes: round 0, worker 0's last push 5, worker 1's 4.
  wire::shard_snapshot old;
  wire::slice_snapshot x;
  x.key = 7;
  x.total = 2;
  x.hi = 2;
  x.value = std::string(8, '\0');
  x.applied = {{0, 5}, {1, 4}};
  old.slices.push_back(x);
  const auto bytes = wire::encode_snapshot(old);
  fixture as(2, false), sy(2, true);
  kvstore::detail::restore_snapshot(as.sh, wire::decode_snapshot(bytes, "test"), 2);
  kvstore::detail::restore_snapshot(sy.sh, wire::decode_snapshot(bytes, "test"), 2);
  CHECK(as.version(7, 2) == 9);
  CHECK(sy.version(7, 2) == 0);  // a sync slice's round was always counted: 0 rounds
  // A version-2 file (no multipliers: its one slice's body ends before them) loads with 1 and 1.
  const std::size_t head = sizeof wire::snapshot_magic + 4 + 8 + 4;
  const std::string body = bytes.substr(head, bytes.size() - head - 16);
  const auto v2 = wire::decode_snapshot(wire::wrap_snapshot_body(body, 2), "test");
  REQUIRE(v2.slices.size() == 1);
  CHECK(v2.slices[0].lr_mult == 1.0);
  CHECK(v2.slices[0].wd_mult == 1.0);
  CHECK(v2.slices[0].applied == x.applied);
  // A version-3 file whose multiplier is not finite is refused whole.
  auto bad = x;
  bad.lr_mult = std::numeric_limits<double>::infinity();
  wire::shard_snapshot with_bad;
  with_bad.slices.push_back(bad);
  CHECK(error_of([&] { wire::decode_snapshot(wire::encode_snapshot(with_bad), "test"); }) ==
        errc::bad_file);
}

// ---- element ranges (flag_range): push_range / pull_range's frames ---------------------------

namespace {

/// One frame of a range push: elements [offset, offset + v.size()) of the range [lo, lo + len).
void push_range(fixture& f, int rank, std::uint64_t key, const std::vector<float>& v,
                std::uint64_t offset, std::uint64_t total, std::uint64_t lo, std::uint64_t len,
                std::uint64_t seq = 0, bool last = true) {
  wire::header h = f.push_header(key, offset, v.size(), total, seq, last);
  h.flags |= wire::flag_range;
  f.sh.handle(rank, f.port(rank), h, wire::encode_range({lo, len}), bytes_of(v));
}

/// A range pull's answer, put together from its data frames: offsets count from the range's
/// first element, every frame is flagged flag_range, the last flag_last.
std::vector<float> pull_range(fixture& f, std::uint64_t key, std::uint64_t total, std::uint64_t lo,
                              std::uint64_t len) {
  wire::header h;
  h.command = wire::cmd::pull;
  h.flags = wire::flag_range;
  h.key = key;
  h.req_id = ++f.req;
  h.type = wire::dtype::f32;
  h.total = total;
  h.offset = lo;
  auto& g = f.got(0);
  g.clear();
  f.sh.handle(0, f.port(0), h, wire::encode_range({lo, len}), {});
  std::vector<float> out;
  for (std::size_t i = 0; i < g.size(); ++i) {
    REQUIRE(g[i].data);
    CHECK(g[i].h.req_id == h.req_id);
    CHECK(g[i].h.offset == out.size());
    CHECK((g[i].h.flags & wire::flag_range) != 0);
    CHECK(((g[i].h.flags & wire::flag_last) != 0) == (i + 1 == g.size()));
    out.insert(out.end(), g[i].values.begin(), g[i].values.end());
  }
  g.clear();
  return out;
}

}  // namespace

TEST_CASE(
    "a sync round of ranges: each counts as its worker's push; elements no one wrote keep "
    "their value; an optimizer updates only the written ones, one step" *
    doctest::timeout(10)) {
  fixture f(2);
  f.init_all(1, {1, 2, 3, 4, 5, 6}, 10, 16, 20);  // this server holds [10, 16) of 20
  push_range(f, 0, 1, {1, 1}, 11, 20, 11, 2);
  CHECK(f.got(0).empty());  // the round waits for worker 1
  push_range(f, 1, 1, {10, 10, 10}, 12, 20, 12, 3);
  REQUIRE(f.got(0).size() == 1);
  REQUIRE(f.got(1).size() == 1);
  CHECK(f.got(1)[0].status == errc::ok);
  f.got(0).clear();
  f.got(1).clear();
  // No optimizer: each written element takes the round's sum over the workers that wrote it.
  CHECK(f.pull(1, 20, 10) == std::vector<float>{1, 1, 11, 10, 10, 6});
  CHECK(pull_range(f, 1, 20, 12, 3) == std::vector<float>{11, 10, 10});
  CHECK(f.sh.slices().at(1).round == 1);

  optim::sgd o;
  o.learning_rate = 0.5;
  f.set_optimizer("sgd", params_of(o));
  // A whole push from worker 0 and a range of one element from worker 1, in two frames.
  f.push(0, 1, {2, 2, 2, 2, 2, 2}, 10, 20);
  push_range(f, 1, 1, {4}, 10, 20, 10, 2, 0, false);
  CHECK(f.got(1).empty());
  push_range(f, 1, 1, {8}, 11, 20, 10, 2, 0, true);
  REQUIRE(f.got(1).size() == 1);
  CHECK(f.got(1)[0].status == errc::ok);
  CHECK(f.pull(1, 20, 10) == std::vector<float>{1 - 0.5f * 6, 1 - 0.5f * 10, 11 - 0.5f * 2,
                                                10 - 0.5f * 2, 10 - 0.5f * 2, 6 - 0.5f * 2});
  CHECK(f.sh.slices().at(1).st_f.step == 1);
}

TEST_CASE(
    "ranges in dist_async: applied on arrival, one optimizer step per push; a range pull "
    "is answered in chunks" *
    doctest::timeout(10)) {
  fixture f(2, /*sync=*/false, 2 * sizeof(float));
  f.init_all(2, {0, 0, 0, 0, 0}, 5, 10, 10);
  push_range(f, 1, 2, {7, 8}, 6, 10, 6, 2);
  REQUIRE(f.got(1).size() == 1);
  CHECK(f.pull(2, 10, 5) == std::vector<float>{0, 7, 8, 0, 0});
  optim::sgd o;
  o.learning_rate = 0.25;
  f.set_optimizer("sgd", params_of(o));
  // Sequence 3 in two frames: one step.
  push_range(f, 0, 2, {4}, 8, 10, 8, 2, 3, false);
  push_range(f, 0, 2, {8}, 9, 10, 8, 2, 3, true);
  CHECK(f.sh.slices().at(2).st_f.step == 1);
  CHECK(pull_range(f, 2, 10, 5, 5) == std::vector<float>{0, 7, 8, -1, -2});  // 3 frames of 2
}

TEST_CASE(
    "a range outside the slice, or a frame outside its range, is refused and changes "
    "nothing; a malformed range breaks the protocol" *
    doctest::timeout(10)) {
  fixture f(1);
  f.init_all(3, {1, 2, 3, 4}, 4, 8, 8);
  auto refused = [&](auto&& call) { return error_of(call); };
  CHECK(refused([&] { pull_range(f, 3, 8, 2, 3); }) == errc::size_mismatch);  // starts before
  CHECK(refused([&] { pull_range(f, 3, 8, 6, 3); }) == errc::size_mismatch);  // ends after
  CHECK(refused([&] { push_range(f, 0, 3, {9, 9}, 3, 8, 3, 2); }) == errc::size_mismatch);
  CHECK(refused([&] { push_range(f, 0, 3, {9, 9, 9}, 5, 8, 5, 2); }) == errc::size_mismatch);
  CHECK(refused([&] { push_range(f, 0, 3, {9}, 4, 8, 5, 2); }) == errc::size_mismatch);
  CHECK(refused([&] { pull_range(f, 3, 8, 4, 0); }) == errc::protocol);  // empty
  wire::header h = f.push_header(3, 4, 1, 8);
  h.flags |= wire::flag_range;
  const std::vector<float> one{9};
  CHECK(refused([&] { f.sh.handle(0, f.port(0), h, "short", bytes_of(one)); }) == errc::protocol);
  CHECK(refused([&] {
          f.sh.handle(0, f.port(0), h, wire::encode_range({~std::uint64_t{0}, 2}), bytes_of(one));
        }) == errc::protocol);  // wraps
  CHECK(f.got(0).empty());
  CHECK(f.pull(3, 8, 4) == std::vector<float>{1, 2, 3, 4});
  CHECK(f.sh.slices().at(3).round == 0);
  // The server's message names the key, the range and the slice.
  try {
    pull_range(f, 3, 8, 6, 3);
  } catch (const kvstore::error& e) {
    const std::string m = e.what();
    CHECK(m.find("key 3") != std::string::npos);
    CHECK(m.find("[6, 9)") != std::string::npos);
    CHECK(m.find("[4, 8)") != std::string::npos);
  }
}

TEST_CASE(
    "a range pull is held as a pull is: staleness 0 in dist_async, answered with just its "
    "elements once the slower worker pushed" *
    doctest::timeout(10)) {
  fixture f(versioned(2, false, 0));
  f.init_all(1, {0, 0, 0, 0}, 0, 4, 4);
  push_range(f, 0, 1, {5, 6}, 1, 4, 1, 2, 1);  // worker 0's push 1 of the key
  f.got(0).clear();
  wire::header h;
  h.command = wire::cmd::pull;
  h.flags = wire::flag_range;
  h.key = 1;
  h.req_id = ++f.req;
  h.type = wire::dtype::f32;
  h.total = 4;
  h.offset = 1;
  f.sh.handle(0, f.port(0), h, wire::encode_range({1, 3}), {});
  CHECK(f.answer_of(0, h.req_id).empty());  // worker 1 has pushed nothing yet
  CHECK(f.sh.held() == 1);
  push_range(f, 1, 1, {7}, 3, 4, 3, 1, 1);
  CHECK(f.answer_of(0, h.req_id) == std::vector<float>{5, 6, 7});
  CHECK(f.sh.held() == 0);
}

// ---- compressed pushes and pulls (wire/encoding.hpp) ----------------------------------------

namespace {

// v in 16-bit encoding e.
std::vector<std::byte> encoded16(wire::encoding e, const std::vector<float>& v) {
  std::vector<std::byte> out(2 * v.size());
  wire::encode_16bit(e, v.data(), v.size(), out.data());
  return out;
}
// v (multiples of t: -t, 0 or t) in 2-bit codes.
std::vector<std::byte> encoded2(const std::vector<float>& v, float t) {
  std::vector<float> residual(v.size(), 0.0f);
  std::vector<std::byte> out(wire::two_bit_bytes(v.size()));
  wire::encode_two_bit(v.data(), residual.data(), v.size(), t, out.data());
  for (float r : residual) REQUIRE(r == 0.0f);
  return out;
}
// What a 16-bit code stands for.
float decoded16(wire::encoding e, float x) {
  return e == wire::encoding::fp16   ? wire::from_fp16(wire::to_fp16(x))
         : e == wire::encoding::bf16 ? wire::from_bf16(wire::to_bf16(x))
                                     : wire::from_bf16(wire::to_bf16_trunc(x));
}

// One frame of a compressed push: its payload read where the shard's sink says (never in place:
// it is decoded, not stored), then handled.
void push_encoded(fixture& f, int rank, std::uint64_t key, wire::encoding e,
                  const std::vector<std::byte>& payload, std::uint64_t offset, std::uint64_t total,
                  std::uint64_t seq = 0, bool last = true) {
  wire::header h = f.push_header(key, offset, 0, total, seq, last);
  h.flags |= wire::encoding_flags(e);
  h.payload_len = payload.size();
  CHECK(f.sh.sink(rank, h).empty());
  f.sh.handle(rank, f.port(rank), h, {}, payload);
}

// A pull answered in 16-bit encoding e: every data frame flagged with it, offsets absolute, at
// most `per` elements each; their payloads decoded.
std::vector<float> pull_encoded(fixture& f, std::uint64_t key, std::uint64_t total,
                                wire::encoding e, std::uint64_t lo, std::size_t per) {
  wire::header h;
  h.command = wire::cmd::pull;
  h.key = key;
  h.req_id = ++f.req;
  h.type = wire::dtype::f32;
  h.total = total;
  h.offset = lo;
  h.flags = wire::encoding_flags(e);
  auto& g = f.got(0);
  g.clear();
  f.sh.handle(0, f.port(0), h, {}, {});
  std::vector<float> out;
  for (std::size_t i = 0; i < g.size(); ++i) {
    REQUIRE(g[i].data);
    CHECK(wire::encoding_bits(g[i].h.flags) == static_cast<unsigned>(e));
    CHECK(g[i].h.offset == lo + out.size());
    CHECK(((g[i].h.flags & wire::flag_last) != 0) == (i + 1 == g.size()));
    REQUIRE(g[i].raw.size() % 2 == 0);
    const std::size_t n = g[i].raw.size() / 2;
    CHECK(n <= per);
    out.resize(out.size() + n);
    wire::decode_16bit<false>(e, reinterpret_cast<const std::byte*>(g[i].raw.data()), n,
                              out.data() + out.size() - n);
  }
  g.clear();
  return out;
}

}  // namespace

TEST_CASE("a round of fp16, bf16, bf16_trunc and 2-bit pushes is decoded and summed in float" *
          doctest::timeout(10)) {
  fixture f(4);
  f.init_all(1, {0, 0, 0, 0}, 0, 4, 4);
  const std::vector<float> g{0.1f, 70000.0f, -2.5f, 1e-6f};
  push_encoded(f, 0, 1, wire::encoding::fp16, encoded16(wire::encoding::fp16, g), 0, 4);
  push_encoded(f, 1, 1, wire::encoding::bf16, encoded16(wire::encoding::bf16, g), 0, 4);
  push_encoded(f, 2, 1, wire::encoding::bf16_trunc, encoded16(wire::encoding::bf16_trunc, g), 0, 4);
  const std::vector<float> q{0.5f, -0.5f, 0.0f, 0.5f};
  push_encoded(f, 3, 1, wire::encoding::two_bit, encoded2(q, 0.5f), 0, 4);
  for (int r = 0; r < 4; ++r) {
    REQUIRE(f.got(r).size() == 1);
    CHECK(f.got(r)[0].status == errc::ok);
  }
  std::vector<float> want(4);
  for (std::size_t i = 0; i < 4; ++i)  // in arrival order, in float
    want[i] = ((decoded16(wire::encoding::fp16, g[i]) + decoded16(wire::encoding::bf16, g[i])) +
               decoded16(wire::encoding::bf16_trunc, g[i])) +
              q[i];
  CHECK(want[0] == 0.0999755859375f + 0.10009765625f + 0.099609375f + 0.5f);
  CHECK(std::isinf(want[1]));  // 70000 is Inf in fp16: IEEE's overflow, summed as such
  CHECK(f.pull(1, 4) == want);
  // A single worker's compressed push is never read straight into the round's buffer.
  fixture one(1);
  one.init_all(2, {0, 0}, 0, 2, 2);
  push_encoded(one, 0, 2, wire::encoding::bf16_trunc,
               encoded16(wire::encoding::bf16_trunc, {0.1f, 3}), 0, 2);
  CHECK(one.pull(2, 2) == std::vector<float>{0.099609375f, 3});
}

TEST_CASE("compressed frames at unaligned offsets: staged sums, and one async optimizer step" *
          doctest::timeout(10)) {
  SUBCASE("sync, two workers, 2-bit frames over [0, 3) and [3, 7), plain over [2, 7) and [0, 2)") {
    fixture f(2);
    f.init_all(3, std::vector<float>(7, 0.0f), 0, 7, 7);
    const std::vector<float> a{0.25f, -0.25f, 0, 0.25f, 0.25f, 0, -0.25f};
    push_encoded(f, 0, 3, wire::encoding::two_bit, encoded2({a.begin(), a.begin() + 3}, 0.25f), 0,
                 7, 0, false);
    f.push(1, 3, {1, 1, 1, 1, 1}, 2, 7, 0, false);
    push_encoded(f, 0, 3, wire::encoding::two_bit, encoded2({a.begin() + 3, a.end()}, 0.25f), 3, 7,
                 0, true);
    f.push(1, 3, {2, 2}, 0, 7, 0, true);
    REQUIRE(f.got(0).size() == 1);
    CHECK(f.pull(3, 7) == std::vector<float>{2.25f, 1.75f, 1, 1.25f, 1.25f, 1, 0.75f});
  }
  SUBCASE("async, sgd: a fp16 push in two frames is one step on the decoded gradient") {
    fixture f(1, /*sync=*/false);
    f.init_all(4, std::vector<float>(5, 1.0f), 0, 5, 5);
    optim::sgd o;
    o.learning_rate = 0.5;
    f.set_optimizer("sgd", params_of(o));
    const std::vector<float> g{0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
    push_encoded(f, 0, 4, wire::encoding::fp16, encoded16(wire::encoding::fp16, {0.1f, 0.2f}), 0, 5,
                 9, false);
    CHECK(f.got(0).empty());
    push_encoded(f, 0, 4, wire::encoding::fp16, encoded16(wire::encoding::fp16, {0.3f, 0.4f, 0.5f}),
                 2, 5, 9, true);
    REQUIRE(f.got(0).size() == 1);
    std::vector<float> want(5);
    for (std::size_t i = 0; i < 5; ++i)
      want[i] = 1.0f - 0.5f * decoded16(wire::encoding::fp16, g[i]);
    CHECK(f.pull(4, 5) == want);
    CHECK(f.sh.slices().at(4).st_f.step == 1);
  }
}

TEST_CASE("a pull asking for 16 bits is answered in them, in chunk_bytes, the value untouched" *
          doctest::timeout(10)) {
  fixture f(1, true, 3 * 2);  // 3 halves per data frame
  const std::vector<float> v{0.1f, 1, 2, 70000.0f, -0.3f, 1e-8f, 65504};
  f.init_all(5, v, 10, 17, 20);
  for (auto e : {wire::encoding::fp16, wire::encoding::bf16, wire::encoding::bf16_trunc}) {
    CAPTURE(wire::encoding_name(e));
    std::vector<float> want(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) want[i] = decoded16(e, v[i]);
    CHECK(pull_encoded(f, 5, 20, e, 10, 3) == want);
  }
  CHECK(f.pull(5, 20, 10) == v);  // the server keeps full precision
}

TEST_CASE("compressed requests that do not fit their encoding: errors, and nothing changes" *
          doctest::timeout(10)) {
  fixture f(1);
  f.init_all(1, {1, 2, 3, 4}, 2, 6, 8);
  const std::vector<float> before{1, 2, 3, 4};
  auto header = [&](wire::encoding e, std::uint64_t payload, std::uint64_t offset = 2) {
    wire::header h = f.push_header(1, offset, 0, 8);
    h.flags |= wire::encoding_flags(e);
    h.payload_len = payload;
    return h;
  };
  // The sink: at most the slice's elements in the encoding, before a byte is read.
  CHECK(f.sh.sink(0, header(wire::encoding::fp16, 8)).empty());
  CHECK(error_of([&] { (void)f.sh.sink(0, header(wire::encoding::fp16, 10)); }) == errc::protocol);
  CHECK(error_of([&] { (void)f.sh.sink(0, header(wire::encoding::fp16, 16)); }) ==
        errc::protocol);  // the slice's plain bytes: too many halves
  CHECK(f.sh.sink(0, header(wire::encoding::two_bit, 5)).empty());
  CHECK(error_of([&] { (void)f.sh.sink(0, header(wire::encoding::two_bit, 6)); }) ==
        errc::protocol);
  CHECK(error_of([&] { (void)f.sh.sink(0, header(static_cast<wire::encoding>(7), 4)); }) ==
        errc::protocol);  // unknown: cannot be sized
  // The payload: whole elements, well-formed codes, inside the slice.
  auto handle = [&](wire::encoding e, std::vector<std::byte> p, std::uint64_t offset = 2) {
    f.sh.handle(0, f.port(0), header(e, p.size(), offset), {}, p);
  };
  CHECK(error_of([&] { handle(wire::encoding::fp16, std::vector<std::byte>(3)); }) ==
        errc::protocol);
  auto bad_codes = encoded2({0.5f, 0.5f}, 0.5f);
  bad_codes.back() = std::byte{0xF7};  // code 3 between elements
  CHECK(error_of([&] { handle(wire::encoding::two_bit, bad_codes); }) == errc::protocol);
  CHECK(error_of([&] {
          handle(wire::encoding::two_bit, encoded2({0.5f, 0.5f, 0.5f}, 0.5f), 4);
        }) == errc::size_mismatch);  // [4, 7) of the slice [2, 6)
  CHECK(error_of([&] { handle(wire::encoding::fp16, encoded16(wire::encoding::fp16, {1}), 1); }) ==
        errc::size_mismatch);
  // An encoding this server does not know: the request is refused, the connection kept.
  CHECK(error_of([&] { handle(static_cast<wire::encoding>(9), {}); }) == errc::unsupported);
  auto pull = [&](unsigned bits) {
    wire::header h;
    h.command = wire::cmd::pull;
    h.key = 1;
    h.req_id = ++f.req;
    h.type = wire::dtype::f32;
    h.total = 8;
    h.offset = 2;
    h.flags = bits << wire::encoding_shift;
    f.sh.handle(0, f.port(0), h, {}, {});
  };
  CHECK(error_of([&] { pull(12); }) == errc::unsupported);
  CHECK(error_of([&] { pull(static_cast<unsigned>(wire::encoding::two_bit)); }) ==
        errc::invalid_argument);  // 2-bit compresses pushes only
  CHECK(f.got(0).empty());
  CHECK(f.sh.slices().at(1).round_done.empty());
  CHECK(f.sh.slices().at(1).cov.empty());
  CHECK(f.pull(1, 8, 2) == before);
  // And the shard serves on.
  push_encoded(f, 0, 1, wire::encoding::bf16, encoded16(wire::encoding::bf16, {1, 1, 1, 1}), 2, 8);
  CHECK(f.pull(1, 8, 2) == std::vector<float>{1, 1, 1, 1});
}

TEST_CASE("a compressed pull held for a version is answered in its encoding; ranges stay plain" *
          doctest::timeout(10)) {
  fixture f(1);
  f.init_all(1, {0, 0, 0, 0}, 0, 4, 4);
  wire::header h;
  h.command = wire::cmd::pull;
  h.key = 1;
  h.req_id = ++f.req;
  h.type = wire::dtype::f32;
  h.total = 4;
  h.aux = 1;  // min version: the first round
  h.flags = wire::encoding_flags(wire::encoding::bf16_trunc);
  f.sh.handle(0, f.port(0), h, {}, {});
  CHECK(f.got(0).empty());  // held
  f.push(0, 1, {0.1f, 70000.0f, 1, 2}, 0, 4);
  std::vector<float> values;
  for (auto& a : f.got(0)) {
    if (!a.data) continue;
    CHECK(wire::encoding_bits(a.h.flags) == static_cast<unsigned>(wire::encoding::bf16_trunc));
    CHECK(a.h.req_id == h.req_id);
    values.resize(a.raw.size() / 2);
    wire::decode_16bit<false>(wire::encoding::bf16_trunc,
                              reinterpret_cast<const std::byte*>(a.raw.data()), values.size(),
                              values.data());
  }
  CHECK(values == std::vector<float>{0.099609375f, 69632.0f, 1, 2});
  // A pull in an unknown encoding is refused at once, not held.
  h.req_id = ++f.req;
  h.aux = 5;
  h.flags = 9u << wire::encoding_shift;
  CHECK(error_of([&] { f.sh.handle(0, f.port(0), h, {}, {}); }) == errc::unsupported);
  // Range pushes and pulls travel plain: one in 16 bits is refused.
  h.flags = wire::flag_range | wire::encoding_flags(wire::encoding::fp16);
  h.aux = 0;
  CHECK(error_of([&] {
          f.sh.handle(0, f.port(0), h, wire::encode_range({0, 2}), {});
        }) == errc::unsupported);
  wire::header p = f.push_header(1, 0, 0, 4, 0, true);
  p.flags |= wire::flag_range | wire::encoding_flags(wire::encoding::fp16);
  const auto halves = encoded16(wire::encoding::fp16, {1, 1});
  p.payload_len = halves.size();
  CHECK(error_of([&] {
          f.sh.handle(0, f.port(0), p, wire::encode_range({0, 2}), halves);
        }) == errc::unsupported);
  CHECK(f.pull(1, 4) == std::vector<float>{0.1f, 70000.0f, 1, 2});
}
