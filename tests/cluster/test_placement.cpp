// Placement over real loopback TCP, ranks as threads: partition::even (BigDL's chunks) seen
// through slice_of and through what each server holds (its snapshot), push_range / pull_range in
// dist_sync and dist_async with and without an optimizer, their errors, and colocated servers
// (every worker's store serves a shard: ranks paired, the server lingers for the others and runs
// the program's command handlers, every thread joined at the end).
#include <kvstore/kvstore.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <kvstore/client/client.hpp>  // detail::worker_client, a worker without a store
#include <kvstore/server/checkpoint.hpp>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/process.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

using kvstore::dist;
using kvstore::errc;
using kvstore::KVStore;
using kvtest::expect_error;
using kvtest::filled;
using kvtest::iota;
using range = std::pair<std::size_t, std::size_t>;

namespace {

const kvstore::init_options even{.partition = kvstore::partition::even};

// What server `rank` holds of key `id`, read from the snapshot it wrote on kv.checkpoint():
// (lo, hi) and the values, or nothing.
struct held {
  std::uint64_t lo = 0, hi = 0;
  std::vector<float> value;
};
std::optional<held> held_by(const kvtest::temp_dir& dir, int rank, std::uint64_t id) {
  const auto snap =
      kvstore::detail::load_snapshot(kvstore::detail::snapshot_path(dir.path(), rank));
  for (const auto& s : snap.slices)
    if (s.key == id) {
      held h{s.lo, s.hi, std::vector<float>(s.value.size() / sizeof(float))};
      std::memcpy(h.value.data(), s.value.data(), s.value.size());
      return h;
    }
  return std::nullopt;
}

// Commands the colocated servers ran (they run the program's registered handlers).
std::atomic<int> commands_run{0};
KVSTORE_REGISTER_COMMAND_HANDLER([](int head, std::string_view) { commands_run += head; });

// Threads of this process, from /proc.
int thread_count() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

}  // namespace

TEST_CASE(
    "partition::even: BigDL's chunk i on server i, through slice_of and in what each "
    "server holds" *
    doctest::timeout(60)) {
  SUBCASE("10 elements over 3 servers: (0, 4), (4, 3), (7, 3)") {
    kvtest::temp_dir dir;
    auto o = kvtest::test_options(2, 3);
    o.checkpoint_dir = dir.path().string();
    kvtest::cluster c(o);
    c.run_workers([&](KVStore<dist>& kv) {
      kv.init(7, iota(10, 0.0f), even);
      CHECK(kv.slice_of(7, 0) == range{0, 4});
      CHECK(kv.slice_of(7, 1) == range{4, 3});
      CHECK(kv.slice_of(7, 2) == range{7, 3});
      kv.barrier();
      if (kv.rank() == 0) kv.checkpoint();
      kv.barrier();
    });
    const range want[] = {{0, 4}, {4, 3}, {7, 3}};
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      auto h = held_by(dir, s, 7);
      REQUIRE(h);
      CHECK(h->lo == want[s].first);
      CHECK(h->hi - h->lo == want[s].second);
      CHECK(h->value == iota(want[s].second, static_cast<float>(want[s].first)));
    }
  }
  SUBCASE("2 elements over 4 servers: (0, 1), (1, 1), (2, 0), (2, 0)") {
    kvtest::temp_dir dir;
    auto o = kvtest::test_options(1, 4);
    o.checkpoint_dir = dir.path().string();
    kvtest::cluster c(o);
    c.run_workers([&](KVStore<dist>& kv) {
      kv.init(3, std::vector<float>{5, 6}, even);
      CHECK(kv.slice_of(3, 0) == range{0, 1});
      CHECK(kv.slice_of(3, 1) == range{1, 1});
      CHECK(kv.slice_of(3, 2) == range{2, 0});
      CHECK(kv.slice_of(3, 3) == range{2, 0});
      kv.checkpoint();
    });
    for (int s = 0; s < 2; ++s) {
      auto h = held_by(dir, s, 3);
      REQUIRE(h);
      CHECK(h->lo == static_cast<std::uint64_t>(s));
      CHECK(h->value == std::vector<float>{static_cast<float>(5 + s)});
    }
    CHECK_FALSE(held_by(dir, 2, 3));  // empty chunks: nothing on servers 2 and 3
    CHECK_FALSE(held_by(dir, 3, 3));
  }
}

TEST_CASE(
    "push_range / pull_range in dist_sync: a range counts as the worker's push of every "
    "slice it touches; elements no one wrote keep their value" *
    doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(2, 3));
  c.run_workers([](KVStore<dist>& kv) {
    const float r = static_cast<float>(kv.rank());
    kv.init("w", iota(10, 0.0f), even);
    // BigDL's put_gradients: each worker sends every chunk of its gradient to its owner.
    const auto g = iota(10, 1.0f + r);  // worker 0: 1..10, worker 1: 2..11
    for (int s = 0; s < 3; ++s) {
      auto [start, len] = kv.slice_of("w", s);
      kv.push_range("w", start, std::span<const float>(g).subspan(start, len));
    }
    kv.wait_all();
    std::vector<float> all(10);
    kv.pull("w", all).wait();
    CHECK(all == iota(10, 3.0f, 2.0f));  // no optimizer: the round's sum, 3, 5, ..., 21
    std::vector<float> mine(kv.slice_of("w", 1).second);
    kv.pull_range("w", 4, mine).wait();
    CHECK(mine == std::vector<float>{11, 13, 15});
    // One range over parts of all three slices: [3, 8) from both workers.
    kv.push_range("w", 3, filled(5, 1.0f + r)).wait();
    kv.pull("w", all).wait();
    CHECK(all == std::vector<float>{3, 5, 7, 3, 3, 3, 3, 3, 19, 21});
    std::vector<float> cross(6);
    kv.pull_range("w", 2, cross).wait();
    CHECK(cross == std::vector<float>{7, 3, 3, 3, 3, 3});

    // With an optimizer the range is the gradient of its elements only: sgd, lr 0.25.
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.25});
    kv.push_range("w", 6, filled(3, 2.0f)).wait();  // summed: 4 on [6, 9)
    kv.pull("w", all).wait();
    CHECK(all == std::vector<float>{3, 5, 7, 3, 3, 3, 2, 2, 18, 21});
  });
}

TEST_CASE("push_range / pull_range in dist_async, without and with an optimizer" *
          doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(2, 3, /*sync=*/false));
  c.run_workers([](KVStore<dist>& kv) {
    kv.init(11, filled(10, 0.0f), even);
    // Worker 0 writes [0, 5), worker 1 [5, 10): stored as they come.
    const std::size_t at = kv.rank() == 0 ? 0 : 5;
    kv.push_range(11, at, iota(5, static_cast<float>(at))).wait();
    kv.barrier();
    std::vector<float> all(10);
    kv.pull(11, all).wait();
    CHECK(all == iota(10, 0.0f));
    kv.barrier();
    // sgd, lr 0.5: each worker's push of ones over [2, 9) is applied on arrival.
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5});
    kv.push_range(11, 2, filled(7, 1.0f)).wait();
    kv.barrier();
    kv.pull(11, all).wait();
    CHECK(all == std::vector<float>{0, 1, 1, 2, 3, 4, 5, 6, 7, 9});
    std::vector<float> tail(3);
    kv.pull_range(11, 7, tail).wait();
    CHECK(tail == std::vector<float>{6, 7, 9});
  });
}

TEST_CASE("bad ranges and placements are errors naming the key and the range; nothing changes" *
          doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(1, 3));
  c.run_workers([](KVStore<dist>& kv) {
    kv.init(5, iota(10, 0.0f), even);
    std::vector<float> three(3), none;
    expect_error([&] { kv.push_range(5, 8, three); }, errc::size_mismatch, {"key 5", "[8, 11)"});
    expect_error([&] { kv.pull_range(5, 10, three); }, errc::size_mismatch, {"key 5", "[10, 13)"});
    expect_error([&] { kv.pull_range(5, ~std::size_t{0}, three); }, errc::size_mismatch, {"key 5"});
    expect_error([&] { kv.push_range(5, 4, none); }, errc::invalid_argument,
                 {"key 5", "empty range at offset 4"});
    expect_error([&] { kv.push_range(6, 0, three); }, errc::unknown_key,
                 {"key 6", "never inited", "[0, 3)"});
    expect_error([&] { (void)kv.slice_of(6, 0); }, errc::unknown_key, {"key 6"});
    expect_error([&] { (void)kv.slice_of(5, 3); }, errc::invalid_argument,
                 {"key 5", "server 3", "3 servers"});
    expect_error([&] { (void)kv.slice_of(5, -1); }, errc::invalid_argument, {"server -1"});
    std::vector<float> all(10);
    kv.pull(5, all).wait();
    CHECK(all == iota(10, 0.0f));
    // A hashed key that lives on one server: the others hold (size, 0).
    kv.init(9, filled(4, 1.0f));
    int holders = 0;
    for (int s = 0; s < 3; ++s) {
      auto [start, len] = kv.slice_of(9, s);
      if (len) {
        ++holders;
        CHECK(start == 0);
        CHECK(len == 4);
      } else {
        CHECK(start == 4);
      }
    }
    CHECK(holders == 1);
  });
}

TEST_CASE(
    "colocated: every worker's store serves the shard of its rank; exact values in "
    "dist_sync and dist_async; every thread joined at the end" *
    doctest::timeout(120)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    const int threads_before = thread_count();
    {
      auto o = kvtest::test_options(3, 3, sync);
      o.colocated = true;
      kvtest::cluster c(o);
      c.run_workers([&](KVStore<dist>& kv) {
        CHECK(kv.colocated());
        CHECK(kv.num_servers() == 3);
        kv.init(1, iota(10, 0.0f), even);
        auto [start, len] = kv.slice_of(1, kv.rank());  // BigDL: partition id == rank
        const range want[] = {{0, 4}, {4, 3}, {7, 3}};
        CHECK(range{start, len} == want[kv.rank()]);
        // put_gradients of ones (every chunk), then this worker's weight partition.
        kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1.0});
        kv.push(1, filled(10, 1.0f)).wait();
        kv.barrier();
        std::vector<float> part(len);
        kv.pull_range(1, start, part).wait();
        CHECK(part == iota(len, static_cast<float>(start) - 3.0f));
        std::vector<float> all(10);
        kv.pull(1, all).wait();
        CHECK(all == iota(10, -3.0f));
        kv.barrier();
        if (kv.rank() == 0) kv.send_command_to_servers(10, "colocated");  // each server adds 10
        kv.barrier();
      });
      CHECK(commands_run.exchange(0) == 30);
    }
    CHECK(thread_count() == threads_before);
  }
}

TEST_CASE("colocated: a worker that leaves early keeps serving its shard until the job ends" *
          doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 2);
  o.colocated = true;
  kvtest::cluster c(o);
  c.run_workers([](KVStore<dist>& kv) {
    kv.init(2, iota(8, 1.0f), even);
    if (kv.rank() == 0) {
      kv.set_barrier_before_exit(false);
      return;  // its store says goodbye now; its server still holds [0, 4)
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::vector<float> all(8);
    kv.pull(2, all).wait();
    CHECK(all == iota(8, 1.0f));
    kv.push(2, filled(8, 1.0f)).wait();  // worker 0 left: the round is this worker's alone
    kv.pull(2, all).wait();
    CHECK(all == filled(8, 1.0f));
  });
}

TEST_CASE(
    "colocated: worker rank = server rank whatever order they register in; a server "
    "count that differs is an error naming both" *
    doctest::timeout(60)) {
  // Two servers (ranks 0, 1) and two workers without rank hints, the worker beside server 1
  // registering first: it takes rank 1, not arrival order's 0.
  auto o = kvtest::test_options(2, 2);
  kvtest::cluster c(o);
  int rank_beside[2] = {-1, -1};
  std::thread first([&] {
    auto wo = c.options();
    wo.rank_hint = -1;
    kvstore::detail::worker_client w(wo, {c.server(1).advertised_host(), c.server(1).port()});
    rank_beside[1] = w.rank();
    w.leave_job();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread second([&] {
    auto wo = c.options();
    wo.rank_hint = -1;
    kvstore::detail::worker_client w(wo, {c.server(0).advertised_host(), c.server(0).port()});
    rank_beside[0] = w.rank();
    w.leave_job();
  });
  first.join();
  second.join();
  CHECK(c.server(0).rank() == 0);
  CHECK(c.server(1).rank() == 1);
  CHECK(rank_beside[0] == 0);
  CHECK(rank_beside[1] == 1);

  auto bad = kvtest::test_options(3, 2);
  bad.colocated = true;
  expect_error([&] { KVStore<dist> kv(bad); }, errc::invalid_argument, {"3 workers", "is 2"});
}
