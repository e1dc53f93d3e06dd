// Uneven work: a worker that runs out of batches leaves the sync group and the others' rounds
// and barriers complete without it; a worker that dies is treated the same way (leave_group).
#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/process.hpp"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

using namespace std::chrono_literals;

TEST_CASE("a worker with fewer batches leaves; the others' rounds complete without it" *
          doctest::timeout(60)) {
  auto o = kvtest::test_options(3, 2);
  o.on_worker_death = kvstore::worker_death::leave_group;
  kvtest::cluster c(o);
  c.run_workers([](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> v(100, 0.f), out(100);
    kv.init(7, v);
    // Rank r has 2 + 2r batches: 2, 4, 6 rounds.
    const int batches = 2 + 2 * kv.rank();
    for (int b = 0; b < batches; ++b) {
      std::vector<float> g(100, static_cast<float>(kv.rank() + 1));
      kv.push(7, g).wait();
      kv.pull(7, out).wait();
      // Sum of the ranks still in the group: round b has ranks with more than b batches.
      float want = 0;
      for (int r = 0; r < kv.num_workers(); ++r)
        if (2 + 2 * r > b) want += static_cast<float>(r + 1);
      REQUIRE(out[0] == want);
      REQUIRE(out[99] == want);
    }
    kv.leave();
    CHECK(kv.has_left());
    CHECK_THROWS_AS(kv.push(7, v), kvstore::error);
    kv.pull(7, out).wait();  // pulling still works
    kv.barrier();            // barriers still release everyone
  });
}

namespace {
std::string self_exe;

// Child mode: worker rank 1 of the cluster at 127.0.0.1:port; inits, meets the barrier, then
// dies abruptly (_exit: no goodbye, sockets closed by the kernel).
int child_worker(std::uint16_t port) {
  auto o = kvtest::test_options(2, 1);
  o.scheduler_port = port;
  o.rank_hint = 1;
  o.on_worker_death = kvstore::worker_death::leave_group;
  auto* kv = new kvstore::KVStore<kvstore::dist>(o);  // never destroyed: a death, not an exit
  std::vector<float> v(10, 1.f);
  kv->init(1, v);
  kv->barrier();
  _exit(3);
}
}  // namespace

TEST_CASE("a dead worker leaves the group: the survivors go on" * doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 1);
  o.on_worker_death = kvstore::worker_death::leave_group;
  kvtest::cluster c(o);
  const std::string port = std::to_string(c.options().scheduler_port);
  kvtest::child child = kvtest::spawn({self_exe, "--kv-child-worker", port}, kvtest::environment());
  auto w = c.options();
  w.num_workers = 2;
  w.rank_hint = 0;
  {
    kvstore::KVStore<kvstore::dist> kv(w);
    std::vector<float> v(10, 1.f), out(10);
    kv.init(1, v);
    kv.barrier();
    CHECK(child.wait_exit(30s) == 3);
    for (int round = 0; round < 3; ++round) {
      kv.push(1, v).wait();  // would wait forever if the dead worker were still counted
      kv.pull(1, out).wait();
      REQUIRE(out[0] == 1.f);
    }
    kv.barrier();  // and so would the barrier
    CHECK(kv.num_dead_node(4, 1) == 1);
  }
}

int main(int argc, char** argv) {
  self_exe = argv[0];
  if (argc == 3 && std::strcmp(argv[1], "--kv-child-worker") == 0)
    return child_worker(static_cast<std::uint16_t>(std::stoi(argv[2])));
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
