#include <kvstore/server/apply_pool.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/shard_fixture.hpp"

#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

// A server's apply pool (server/apply_pool.hpp, issue 12): large element-wise updates cut over
// several threads, with the same bits as one pass, and updates that are not element-wise left
// whole.

using kvstore::detail::apply_pool;
using namespace kvtest_shard;

// Counts the calls of its update (chunks) and the threads they ran on; w -= g.
namespace counted {
struct calls_t {
  std::mutex m;
  int calls = 0;
  std::set<std::thread::id> threads;
  void reset() {
    std::lock_guard lk(m);
    calls = 0;
    threads.clear();
  }
};
inline calls_t calls;

struct chunked {
  static constexpr std::string_view name = "test::chunked";
  static constexpr int num_slots = 1;
  static constexpr bool elementwise = true;
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight, const optim::slots_view<T>& s) const {
    {
      std::lock_guard lk(calls.m);
      ++calls.calls;
      calls.threads.insert(std::this_thread::get_id());
    }
    for (std::size_t i = 0; i < weight.size(); ++i) {
      s.slot[0][i] += grad[i];  // the state follows its chunk
      weight[i] -= grad[i] + static_cast<T>(s.step) * s.slot[0][i];
    }
  }
  template <class Ar>
  void serialize(Ar&, unsigned) {}
};
// The same update, not declared element-wise: never cut.
struct whole : chunked {
  static constexpr std::string_view name = "test::whole";
  static constexpr bool elementwise = false;
};
}  // namespace counted

KVSTORE_REGISTER_OPTIMIZER(counted::chunked);
KVSTORE_REGISTER_OPTIMIZER(counted::whole);

TEST_CASE("run covers [0, n) exactly once, in at most one chunk per thread" *
          doctest::timeout(60)) {
  for (unsigned threads : {1u, 2u, 3u, 8u}) {
    apply_pool pool(threads);
    CHECK(pool.threads() == threads);
    for (std::uint64_t n : {1ull, 7ull, 1000ull, 4096ull, 100003ull}) {
      for (std::uint64_t min_chunk : {1ull, 100ull, 5000ull}) {
        CAPTURE(threads);
        CAPTURE(n);
        CAPTURE(min_chunk);
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> chunks{0};
        pool.run(n, min_chunk, [&](std::uint64_t lo, std::uint64_t hi) {
          REQUIRE(lo < hi);
          REQUIRE(hi <= n);
          ++chunks;
          for (std::uint64_t i = lo; i < hi; ++i) ++hits[i];
        });
        for (std::uint64_t i = 0; i < n; ++i) REQUIRE(hits[i] == 1);
        CHECK(chunks <= static_cast<int>(threads));
        CHECK(chunks <= static_cast<int>(std::max<std::uint64_t>(1, n / min_chunk)));
      }
    }
  }
}

TEST_CASE("many runs in a row; an exception in a chunk reaches the caller and the pool goes on" *
          doctest::timeout(60)) {
  apply_pool pool(4);
  std::atomic<std::uint64_t> sum{0};
  for (int r = 0; r < 2000; ++r)
    pool.run(64, 1, [&](std::uint64_t lo, std::uint64_t hi) { sum += hi - lo; });
  CHECK(sum == 2000u * 64u);
  CHECK_THROWS_WITH_AS(pool.run(64, 1,
                                [](std::uint64_t lo, std::uint64_t) {
                                  if (lo > 0) throw std::runtime_error("chunk failed");
                                }),
                       "chunk failed", std::runtime_error);
  sum = 0;
  pool.run(64, 1, [&](std::uint64_t lo, std::uint64_t hi) { sum += hi - lo; });
  CHECK(sum == 64u);
}

TEST_CASE(
    "run_parts: each part at once on a thread of its own, the same one run after run; parts may "
    "wait for each other; an exception reaches the caller" *
    doctest::timeout(60)) {
  apply_pool pool(4);
  std::vector<std::thread::id> first(4);
  std::atomic<int> moved{0}, alone{0};
  for (int r = 0; r < 200; ++r) {
    // Each part waits (5 s at most) until all four started: parts run one after the other
    // would each time out instead.
    std::atomic<unsigned> started{0};
    kvstore::detail::part_barrier all(4);
    pool.run_parts(4, [&](unsigned p) {
      ++started;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (started < 4 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      if (started < 4) ++alone;
      all.arrive_and_wait();  // returns: every part arrived
      if (r == 0)
        first[p] = std::this_thread::get_id();
      else if (first[p] != std::this_thread::get_id())
        ++moved;
    });
  }
  CHECK(alone == 0);
  CHECK(moved == 0);
  CHECK(first[0] == std::this_thread::get_id());  // part 0: the caller
  CHECK(std::set<std::thread::id>(first.begin(), first.end()).size() == 4);
  CHECK_THROWS_WITH_AS(pool.run_parts(3,
                                      [](unsigned p) {
                                        if (p == 2) throw std::runtime_error("part failed");
                                      }),
                       "part failed", std::runtime_error);
  // The pool goes on, run() and run_parts() in turn; fewer parts than threads.
  std::atomic<std::uint64_t> sum{0};
  for (int r = 0; r < 500; ++r) {
    pool.run(64, 1, [&](std::uint64_t lo, std::uint64_t hi) { sum += hi - lo; });
    pool.run_parts(2, [&](unsigned p) { sum += p + 1; });
  }
  CHECK(sum == 500u * (64u + 3u));
}

namespace {

// Three dist_sync rounds of two workers over a key of n floats with optimizer `name`, on a
// shard applying with `threads`; the pulled value after them.
// Threads of this process now (/proc/self/task): the pool's helpers start on first use.
std::size_t process_threads() {
  return static_cast<std::size_t>(
      std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                    std::filesystem::directory_iterator{}));
}

// `name` empty: no optimizer (a round stores the sum). `started`, if given, gets how many
// threads the shard started over the rounds.
std::vector<float> rounds(const std::string& name, const std::string& params, unsigned threads,
                          std::uint64_t n, std::size_t* started = nullptr) {
  auto c = fixture::config(2, true, std::size_t{64} << 20);
  c.apply_threads = threads;
  const std::size_t before = process_threads();
  fixture f(c);
  std::vector<float> init(n);
  for (std::uint64_t i = 0; i < n; ++i) init[i] = static_cast<float>(i % 1000) * 0.001f;
  f.init_all(1, init, 0, n, n);
  if (!name.empty()) f.set_optimizer(name, params);
  for (int round = 1; round <= 3; ++round)
    for (int r = 0; r < 2; ++r) {
      std::vector<float> g(n);
      for (std::uint64_t i = 0; i < n; ++i)
        g[i] =
            static_cast<float>((i * 7 + static_cast<std::uint64_t>(round + r)) % 97) * 0.01f - 0.4f;
      f.push(r, 1, g, 0, n, static_cast<std::uint64_t>(round));
    }
  for (int r = 0; r < 2; ++r) {
    REQUIRE(f.got(r).size() == 3);
    for (auto& a : f.got(r)) REQUIRE(a.status == errc::ok);
    f.got(r).clear();
  }
  if (started) *started = process_threads() - before;
  return f.pull(1, n);
}

}  // namespace

TEST_CASE("a large key's element-wise update is cut over the threads: the same bits as one pass" *
          doctest::timeout(120)) {
  const std::uint64_t n = std::uint64_t{1} << 20;  // 4 chunks of the 2^18-element minimum
  SUBCASE("adam") {
    const auto one = rounds("adam", params_of(optim::adam{.learning_rate = 0.01}), 1, n);
    const auto four = rounds("adam", params_of(optim::adam{.learning_rate = 0.01}), 4, n);
    REQUIRE(one.size() == n);
    CHECK(std::memcmp(one.data(), four.data(), n * sizeof(float)) == 0);
    CHECK(one[5] != doctest::Approx(0.005));  // the optimizer did run
  }
  SUBCASE("sgd with momentum") {
    const auto p = params_of(optim::sgd{.learning_rate = 0.1, .momentum = 0.9});
    const auto one = rounds("sgd", p, 1, n);
    const auto four = rounds("sgd", p, 4, n);
    CHECK(std::memcmp(one.data(), four.data(), n * sizeof(float)) == 0);
  }
  SUBCASE("a registered element-wise optimizer runs once per chunk, on several threads") {
    counted::calls.reset();
    const auto one = rounds("test::chunked", params_of(counted::chunked{}), 1, n);
    CHECK(counted::calls.calls == 3);  // one pass per round
    counted::calls.reset();
    const auto four = rounds("test::chunked", params_of(counted::chunked{}), 4, n);
    CHECK(counted::calls.calls == 3 * 4);
    CHECK(counted::calls.threads.size() > 1);
    CHECK(std::memcmp(one.data(), four.data(), n * sizeof(float)) == 0);
  }
  SUBCASE("an optimizer not declared element-wise is never cut") {
    counted::calls.reset();
    rounds("test::whole", params_of(counted::whole{}), 4, n);
    CHECK(counted::calls.calls == 3);
    CHECK(counted::calls.threads.size() == 1);
  }
  SUBCASE("no optimizer: a round's sum is cut over the threads, the same bits") {
    std::size_t started_one = 0, started_four = 0;
    const auto one = rounds("", "", 1, n, &started_one);
    const auto four = rounds("", "", 4, n, &started_four);
    CHECK(std::memcmp(one.data(), four.data(), n * sizeof(float)) == 0);
    CHECK(started_one == 0);
    CHECK(started_four == 3);  // the pool's helpers, started by the sums alone
    // The last round's sum of both workers' gradients (rank r's of round 3).
    for (std::uint64_t i : {std::uint64_t{0}, std::uint64_t{12345}, n - 1}) {
      const auto g = [&](int r) {
        return static_cast<float>((i * 7 + static_cast<std::uint64_t>(3 + r)) % 97) * 0.01f - 0.4f;
      };
      CHECK(four[i] == g(0) + g(1));
    }
  }
  SUBCASE("a small key is not cut") {
    counted::calls.reset();
    rounds("test::chunked", params_of(counted::chunked{}), 4, (std::uint64_t{1} << 19) - 1);
    CHECK(counted::calls.calls == 3);
  }
}

TEST_CASE("dist_options::server_threads: 0 (every core) by default, more than 1024 refused" *
          doctest::timeout(10)) {
  kvstore::dist_options o;
  CHECK(o.server_threads == 0);
  o.server_threads = 1025;
  CHECK_THROWS_WITH_AS(o.check_versions(), doctest::Contains("server_threads = 1025"),
                       kvstore::error);
}
