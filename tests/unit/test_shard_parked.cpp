// The shard's requests kept back behind an open sync round (server/parked.hpp): a worker that
// pipelines its ops sends its next push or pull of a key before its push of the open round is
// answered; they must take effect after that round, in the order they came, and bounded.
#include <kvstore/server/shard.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/shard_fixture.hpp"

#include <cstdint>
#include <string>
#include <vector>

using namespace kvtest_shard;

namespace {

// Worker `rank`'s push of `v` into key 1 (2 elements), numbered `seq`; its request id.
std::uint64_t push(fixture& f, int rank, const std::vector<float>& v, std::uint64_t seq) {
  f.push(rank, 1, v, 0, 2, seq);
  return f.req;
}

// Worker 0's pushes 1 and 2 of key 1 and a pull, all behind round 1 (worker 1 has not pushed).
struct worker_0_ahead {
  fixture f{2};
  std::uint64_t p1 = 0, p2 = 0, q = 0;
  worker_0_ahead() {
    f.init_all(1, {0, 0}, 0, 2, 2);
    p1 = push(f, 0, {1, 1}, 1);
    p2 = push(f, 0, {2, 2}, 2);
    q = f.send_pull(0, 1, 2);
  }
};

}  // namespace

TEST_CASE("a worker's push and pull behind its own open round wait for it, then go in order" *
          doctest::timeout(10)) {
  fixture f(2);
  f.init_all(1, {0, 0}, 0, 2, 2);
  const auto p1 = push(f, 0, {1, 1}, 1);
  CHECK(responses(f, 0, p1).empty());  // the round waits for worker 1
  // Pipelined behind it: a pull (must see round 1), a push (round 2), a pull (must see round 2).
  const auto q1 = f.send_pull(0, 1, 2);
  const auto p2 = push(f, 0, {100, 100}, 2);
  const auto q2 = f.send_pull(0, 1, 2);
  CHECK(f.sh.parked(1, 0));
  CHECK(f.got(0).empty());  // nothing answered, nothing refused
  CHECK_FALSE(f.sh.parked(1, 1));

  // Worker 1's push completes round 1: push 1 is answered, the pull sees round 1, push 2 opens
  // round 2 and the second pull waits again.
  const auto w1 = push(f, 1, {10, 10}, 1);
  CHECK(responses(f, 0, p1).size() == 1);
  CHECK(responses(f, 1, w1).size() == 1);
  CHECK(f.answer_of(0, q1) == std::vector<float>{11, 11});
  CHECK(responses(f, 0, p2).empty());
  CHECK(f.answer_of(0, q2).empty());
  CHECK(f.sh.parked(1, 0));

  const auto w2 = push(f, 1, {20, 20}, 2);
  CHECK(responses(f, 0, p2).size() == 1);
  CHECK(responses(f, 1, w2).size() == 1);
  CHECK(f.answer_of(0, q2) == std::vector<float>{120, 120});
  CHECK_FALSE(f.sh.parked(1, 0));
  CHECK(f.version(1, 2) == 2);
}

TEST_CASE("kept-back pushes of both workers complete the next round when they are served" *
          doctest::timeout(10)) {
  fixture f(2);
  f.init_all(1, {0, 0}, 0, 2, 2);
  // Worker 0 runs three pushes ahead; worker 1 catches up one push at a time.
  std::vector<std::uint64_t> ids;
  for (std::uint64_t r = 1; r <= 3; ++r) ids.push_back(push(f, 0, {float(r), float(r)}, r));
  const auto q = f.send_pull(0, 1, 2);
  for (std::uint64_t r = 1; r <= 3; ++r) {
    CHECK(responses(f, 0, ids[r - 1]).empty());
    push(f, 1, {0, 0}, r);
    CHECK(responses(f, 0, ids[r - 1]).size() == 1);
    CHECK(f.version(1, 2) == r);
  }
  CHECK(f.answer_of(0, q) == std::vector<float>{3, 3});  // no optimizer: round 3 is stored
}

TEST_CASE("an optimizer applies each kept-back push in its own round" * doctest::timeout(10)) {
  fixture f(2);
  f.init_all(1, {0, 0}, 0, 2, 2);
  kvstore::optim::sgd o;
  o.learning_rate = 1;
  f.set_optimizer("sgd", params_of(o));
  push(f, 0, {1, 1}, 1);
  push(f, 0, {2, 2}, 2);
  const auto q = f.send_pull(0, 1, 2);
  push(f, 1, {1, 1}, 1);
  push(f, 1, {2, 2}, 2);
  // w = 0 - (1 + 1) - (2 + 2): two steps, each on its round's sum.
  CHECK(f.answer_of(0, q) == std::vector<float>{-6, -6});
}

TEST_CASE("a worker that dies or leaves: kept-back requests are answered, none hangs" *
          doctest::timeout(10)) {
  worker_0_ahead w;
  auto& [f, p1, p2, q] = w;
  SUBCASE("worker 1 dies: the open round fails, then so does the kept-back push") {
    f.sh.worker_dead(1, "worker 1 (node 11) died");
    auto a1 = responses(f, 0, p1);
    REQUIRE(a1.size() == 1);
    CHECK(a1[0].status == errc::node_dead);
    auto a2 = responses(f, 0, p2);
    REQUIRE(a2.size() == 1);
    CHECK(a2[0].status == errc::node_dead);
    CHECK(f.answer_of(0, q) == std::vector<float>{0, 0});  // nothing was applied
    CHECK_FALSE(f.sh.parked(1, 0));
  }
  SUBCASE("worker 1 leaves: worker 0's rounds complete without it") {
    CHECK(f.sh.worker_left(1));
    CHECK(responses(f, 0, p1).size() == 1);
    CHECK(responses(f, 0, p2).size() == 1);
    CHECK(f.answer_of(0, q) == std::vector<float>{2, 2});
  }
  SUBCASE("worker 0's connection closes: what it had kept back is dropped") {
    CHECK(f.sh.parked(1, 0));
    f.sh.connection_lost(0);
    CHECK_FALSE(f.sh.parked(1, 0));
  }
}

TEST_CASE("dist_async keeps nothing back: pushes apply as they come" * doctest::timeout(10)) {
  fixture f(2, /*sync=*/false);
  f.init_all(1, {0, 0}, 0, 2, 2);
  push(f, 0, {1, 1}, 1);
  push(f, 0, {2, 2}, 2);
  CHECK_FALSE(f.sh.parked(1, 0));
  CHECK(f.answer_of(0, f.send_pull(0, 1, 2)) == std::vector<float>{2, 2});
}

TEST_CASE("what one worker may keep back is bounded: the next request is refused, by name" *
          doctest::timeout(10)) {
  auto c = fixture::config(2, true, 1 << 20);
  // Bytes bound it: three pushes of two floats fit, with their bookkeeping.
  c.max_held_bytes = 3 * (sizeof(kvstore::detail::parked_request<box_port>) + 2 * sizeof(float));
  fixture f(c);
  f.init_all(1, {0, 0}, 0, 2, 2);
  push(f, 0, {1, 1}, 1);
  for (std::uint64_t r = 2; r <= 4; ++r) push(f, 0, {1, 1}, r);  // three kept back
  try {
    push(f, 0, {1, 1}, 5);
    FAIL("a fourth kept-back request was accepted");
  } catch (const kvstore::error& e) {
    CHECK(code_of(e) == errc::invalid_argument);
    CHECK(std::string(e.what()).find("worker 0") != std::string::npos);
    CHECK(std::string(e.what()).find("key 1") != std::string::npos);
  }
  // The three kept back still go, one round each, as worker 1 pushes.
  for (std::uint64_t r = 1; r <= 4; ++r) push(f, 1, {0, 0}, r);
  CHECK(f.version(1, 2) == 4);
  CHECK_FALSE(f.sh.parked(1, 0));
}
