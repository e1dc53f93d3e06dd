#include <kvstore/compat/multiverso.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"

#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// Multiverso's worker API over kvstore: two workers as threads of this process (each its own
// Multiverso worker, options::per_thread) against a scheduler and a server over loopback TCP, in
// async mode (dist_async) and -sync mode (dist_async, staleness 0); a local store for the calls
// that need no job. Values are exact.

namespace mv = kvstore::compat::multiverso;
using kvstore::errc;
using kvtest::expect_error;

namespace {

using clk = std::chrono::steady_clock;

// The job's options for Multiverso's mode: dist_async, staleness 0 with -sync.
kvstore::dist_options job(bool sync, int workers = 2) {
  auto o = kvtest::test_options(workers, 1, /*sync=*/false);
  if (sync) o.staleness = 0;
  return o;
}

// Runs f(rank) on one thread per worker of `o`, each inside its own Multiverso worker
// (init before, shutdown after); servers and scheduler run as threads. Rethrows the first failure.
template <class F>
void run_workers(const kvstore::dist_options& o, mv::options m, F f,
                 const kvstore::dist_options* servers = nullptr) {
  kvtest::cluster c(servers ? *servers : o);
  std::mutex em;
  std::exception_ptr first;
  std::vector<std::thread> ts;
  for (int w = 0; w < o.num_workers; ++w) {
    ts.emplace_back([&, w] {
      try {
        auto d = o;
        d.scheduler_port = c.options().scheduler_port;
        d.role = kvstore::role::worker;
        d.rank_hint = w;
        mv::options mine = m;
        mine.dist = d;
        mine.per_thread = true;
        mv::init(mine);
        f(w);
        mv::shutdown();
      } catch (...) {
        std::lock_guard lk(em);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

std::vector<float> iota(std::size_t n) { return kvtest::iota<float>(n, 1.0f); }

}  // namespace

TEST_CASE(
    "ArrayTable(10), 2 workers: 3 iterations of add(1..10) twice then a barrier give "
    "12 (j + 1)" *
    doctest::timeout(60)) {
  for (bool sync : {false, true}) {
    CAPTURE(sync);
    run_workers(job(sync), {.sync = sync}, [](int rank) {
      CHECK(mv::num_workers() == 2);
      CHECK(mv::worker_id() == rank);
      mv::ArrayTableHandler table(10);
      CHECK(table.table_id() == 0);
      const auto delta = iota(10);
      for (int i = 1; i <= 3; ++i) {
        table.add(delta);
        table.add(delta);
        mv::barrier();
        const auto got = table.get();
        for (std::size_t j = 0; j < 10; ++j)
          CHECK(got[j] == static_cast<float>(4 * i * static_cast<int>(j + 1)));
        mv::barrier();  // both have read before either adds again
      }
      const auto got = table.get();
      for (std::size_t j = 0; j < 10; ++j) CHECK(got[j] == static_cast<float>(12 * (j + 1)));
    });
  }
}

TEST_CASE(
    "MatrixTable(4, 3), 2 workers: rows {1, 3, 1} added by each; get({3, 1}) in the order "
    "asked, rows 0 and 2 stay 0" *
    doctest::timeout(60)) {
  for (bool sync : {false, true}) {
    CAPTURE(sync);
    run_workers(job(sync), {.sync = sync}, [](int) {
      mv::ArrayTableHandler first(2);  // tables are numbered in creation order on every worker
      mv::MatrixTableHandler m(4, 3);
      CHECK(first.table_id() == 0);
      CHECK(m.table_id() == 1);
      const std::vector<float> data{1, 1, 1, 2, 2, 2, 3, 3, 3};
      m.add(data, {1, 3, 1});
      mv::barrier();
      CHECK(m.get({3, 1}) == std::vector<float>{4, 4, 4, 8, 8, 8});
      CHECK(m.get({0, 2}) == std::vector<float>(6, 0.0f));
      CHECK(m.get() == std::vector<float>{0, 0, 0, 8, 8, 8, 0, 0, 0, 4, 4, 4});
      CHECK(first.get() == std::vector<float>{0, 0});
      mv::barrier();
    });
  }
}

TEST_CASE("the sgd updater: w -= delta, from worker 0's init_value {5, 6, 7}" *
          doctest::timeout(60)) {
  run_workers(job(false), {.updater = "sgd"}, [](int rank) {
    // Worker 1 names another initial value: worker 0's is the one stored.
    const std::vector<float> init =
        rank == 0 ? std::vector<float>{5, 6, 7} : std::vector<float>{50, 60, 70};
    mv::ArrayTableHandler t(3, init);
    CHECK(t.get() == std::vector<float>{5, 6, 7});
    mv::barrier();
    t.add(std::vector<float>{1, 1, 1});
    mv::barrier();
    CHECK(t.get() == std::vector<float>{3, 4, 5});
    mv::barrier();
  });
}

TEST_CASE("momentum_sgd applies each worker's add on its own, as Multiverso's server does" *
          doctest::timeout(60)) {
  // m = 0.5, both workers add {2} twice. By hand, per add: s = 0.5 s + 0.5 * 2; w -= s:
  // s = 1, 1.5 (w = -2.5 after the first add of each), then 1.75, 1.875 (w = -6.125).
  // A dist_sync round would sum the two adds into one step: s = 2, w = -2 (not Multiverso's).
  run_workers(job(true), {.sync = true, .updater = "momentum_sgd", .momentum = 0.5}, [](int) {
    mv::ArrayTableHandler t(1);
    t.add(std::vector<float>{2}, /*sync=*/true);
    mv::barrier();
    CHECK(t.get() == std::vector<float>{-2.5f});
    mv::barrier();
    t.add(std::vector<float>{2}, true);
    mv::barrier();
    CHECK(t.get() == std::vector<float>{-6.125f});
    mv::barrier();
  });
}

TEST_CASE(
    "-sync: a worker's i-th get sees every worker's first i adds, also when the other "
    "worker is slow" *
    doctest::timeout(60)) {
  // Worker 1 sleeps before each add. With -sync worker 0's i-th get waits for worker 1's i-th
  // add: it sees 2i, or 2i + 1 when worker 1 is already one add further. Without -sync, worker
  // 0's first get comes long before worker 1's first add: it sees its own add alone.
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    std::vector<float> seen;  // worker 0's gets
    run_workers(job(sync), {.sync = sync}, [&](int rank) {
      mv::ArrayTableHandler t(1);
      mv::barrier();
      for (int i = 1; i <= 4; ++i) {
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(i == 1 ? 400 : 100));
        t.add(std::vector<float>{1});
        const float v = t.get()[0];
        if (rank == 0) seen.push_back(v);
        if (sync) {
          CHECK(v >= static_cast<float>(2 * i));
          CHECK(v <= static_cast<float>(2 * i + 1));
        }
      }
      mv::barrier();
      CHECK(t.get()[0] == 8.0f);
      mv::barrier();
    });
    REQUIRE(seen.size() == 4);
    if (!sync) CHECK(seen[0] == 1.0f);
  }
}

TEST_CASE("a row out of range, a size mismatch: an error naming the table, nothing changes" *
          doctest::timeout(60)) {
  run_workers(job(false), {}, [](int) {
    mv::MatrixTableHandler m(4, 3);
    mv::ArrayTableHandler a(5);
    const std::vector<float> row{1, 1, 1};
    expect_error([&] { m.add(row, {4}); }, errc::row_out_of_range,
                 {"MatrixTable 0 (4 x 3)", "add", "row 4 is out of range [0, 4)"});
    expect_error([&] { m.add(row, {-1}); }, errc::row_out_of_range, {"row -1"});
    expect_error([&] { m.get({0, 4}); }, errc::row_out_of_range, {"MatrixTable 0", "get", "row 4"});
    expect_error(
        [&] {
          m.add(row, {0, 1});
        },
        errc::size_mismatch, {"MatrixTable 0 (4 x 3)", "3 values, expected 6"});
    expect_error([&] { m.add(row); }, errc::size_mismatch, {"3 values, expected 12"});
    expect_error([&] { a.add(row); }, errc::size_mismatch,
                 {"ArrayTable 1 (5)", "add", "3 values, expected 5"});
    mv::barrier();
    CHECK(m.get() == std::vector<float>(12, 0.0f));
    CHECK(a.get() == std::vector<float>(5, 0.0f));
    mv::barrier();
  });
}

TEST_CASE("init refuses a job that is not Multiverso's mode, before joining it" *
          doctest::timeout(30)) {
  auto sync_job = kvtest::test_options(2, 1, /*sync=*/true);
  expect_error([&] { mv::init({.dist = sync_job, .per_thread = true}); }, errc::invalid_argument,
               {"dist_options::sync", "dist_sync", "dist_async"});
  auto unbounded = job(false);
  expect_error([&] { mv::init({.sync = true, .dist = unbounded, .per_thread = true}); },
               errc::invalid_argument, {"-sync", "staleness 0", "unbounded"});
  expect_error(
      [&] { mv::init({.updater = "adam", .store = mv::store_kind::local, .per_thread = true}); },
      errc::invalid_argument, {"unknown updater \"adam\"", "momentum_sgd"});
  expect_error(
      [&] {
        mv::init({.updater = "momentum_sgd",
                  .momentum = 1.0,
                  .store = mv::store_kind::local,
                  .per_thread = true});
      },
      errc::invalid_argument, {"momentum in [0, 1)"});
}

TEST_CASE("servers running dist_sync are found out at init, not by wrong numbers later" *
          doctest::timeout(60)) {
  // The servers (like a kv_server started without KVSTORE_TYPE) run dist_sync rounds, the
  // workers' options say dist_async: the probe counts the two workers' pushes as one round.
  const auto servers = kvtest::test_options(2, 1, /*sync=*/true);
  try {
    run_workers(
        job(false), {}, [](int) { FAIL("init should have refused the servers"); }, &servers);
    FAIL("no error");
  } catch (const kvstore::error& e) {
    CHECK(e.code() == make_error_code(errc::invalid_argument));
    CHECK(std::string(e.what()).find("the servers run dist_sync rounds") != std::string::npos);
    CHECK(std::string(e.what()).find("KVSTORE_TYPE=dist_async") != std::string::npos);
  }
}

TEST_CASE(
    "one process over the local store: the updaters by hand, calls before init and after "
    "shutdown" *
    doctest::timeout(30)) {
  expect_error([] { mv::ArrayTableHandler t(3); }, errc::invalid_argument,
               {"ArrayTableHandler(3)", "before multiverso::init()"});
  expect_error([] { mv::worker_id(); }, errc::invalid_argument, {"worker_id()", "before"});

  mv::init({.updater = "momentum_sgd",
            .momentum = 0.5,
            .store = mv::store_kind::local,
            .per_thread = true});
  expect_error([] { mv::init({.store = mv::store_kind::local, .per_thread = true}); },
               errc::invalid_argument, {"init() twice"});
  CHECK(mv::num_workers() == 1);
  CHECK(mv::worker_id() == 0);
  mv::ArrayTableHandler t(2, std::vector<float>{10, 20});
  mv::MatrixTableHandler m(3, 2);
  CHECK(t.store_key().name() == "multiverso.table.0");
  CHECK(m.store_key().name() == "multiverso.table.1");
  // s = 0.5 s + 0.5 d; w -= s.  d = {2, 4}: s = {1, 2}, w = {9, 18}; again: s = {1.5, 3},
  // w = {7.5, 15}.
  t.add(std::vector<float>{2, 4});
  CHECK(t.get() == std::vector<float>{9, 18});
  t.add(std::vector<float>{2, 4}, true);
  CHECK(t.get() == std::vector<float>{7.5f, 15});
  // Rows: d = 2 on row 2 (s = 1, w = -1), then row 2 named twice: d = 4 (s = 2.5, w = -3.5).
  m.add(std::vector<float>{2, 2}, {2});
  m.add(std::vector<float>{2, 2, 2, 2}, {2, 2});
  CHECK(m.get({2, 0}) == std::vector<float>{-3.5f, -3.5f, 0, 0});
  mv::barrier();
  mv::shutdown();

  expect_error(
      [&] {
        t.add(std::vector<float>{1, 1});
      },
      errc::shutdown, {"ArrayTable 0 (2)", "add", "after shutdown()"});
  expect_error([&] { m.get(); }, errc::shutdown, {"MatrixTable 1 (3 x 2)", "get"});
  expect_error([] { mv::barrier(); }, errc::shutdown,
               {"barrier()", "after multiverso::shutdown()"});
  expect_error([] { mv::shutdown(); }, errc::shutdown, {"shutdown()"});

  // init may start again: tables are numbered from 0, with the default updater (w += delta).
  mv::init({.store = mv::store_kind::local, .per_thread = true});
  mv::ArrayTableHandler again(2);
  CHECK(again.table_id() == 0);
  again.add(std::vector<float>{1, 2});
  again.add(std::vector<float>{1, 2});
  CHECK(again.get() == std::vector<float>{2, 4});
  mv::shutdown();
}

TEST_CASE("sgd on the local store: w -= delta (the worker scales by the learning rate)" *
          doctest::timeout(30)) {
  mv::init(
      {.updater = "sgd", .learning_rate = 0.1, .store = mv::store_kind::local, .per_thread = true});
  mv::ArrayTableHandler t(3, std::vector<float>{5, 6, 7});
  t.add(std::vector<float>{1, 1, 1});
  t.add(std::vector<float>{1, 1, 1});
  CHECK(t.get() == std::vector<float>{3, 4, 5});
  expect_error(
      [] {
        mv::ArrayTableHandler bad(3, std::vector<float>{1, 2});
      },
      errc::size_mismatch, {"ArrayTableHandler(3)", "init_value has 2 elements"});
  expect_error([] { mv::MatrixTableHandler bad(0, 3); }, errc::invalid_argument,
               {"MatrixTableHandler(0 x 3)", "empty"});
  mv::shutdown();
}
