#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/byte_pipe.hpp"
#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/process.hpp"
#include "support/wire_peer.hpp"

// Internals the store does not declare: the partition rule, the frame header's fields.
#include <kvstore/client/partition.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

// Errors, not hangs: misuse refused with the servers serving on, a server stopped mid-job, a
// worker process killed mid-round, rounds that cannot complete hitting their deadline, and
// garbage sent to a server's or the scheduler's port dropped while real workers carry on.

namespace {

using kvstore::dist;
using kvstore::errc;
using kvstore::KVStore;
using kvtest::expect_error;
using kvtest::filled;
using clk = std::chrono::steady_clock;
using namespace std::chrono_literals;

double seconds_since(clk::time_point t) {
  return std::chrono::duration<double>(clk::now() - t).count();
}

// An integer key of `total` floats whose (only) slice lives on server `server`.
std::int64_t key_on(int server, int servers, std::uint64_t total, std::size_t slice_bytes,
                    std::int64_t from = 1) {
  for (std::int64_t k = from;; ++k) {
    auto p = kvstore::detail::partition(static_cast<std::uint64_t>(k), total, 0, 4, servers,
                                        slice_bytes);
    if (p.size() == 1 && p[0].server == server) return k;
  }
}

using raw_client = kvtest::wire_peer;
using kvtest::hdr;

namespace asio = boost::asio;
using asio::ip::tcp;

// A lossy link in front of a server or the scheduler: listens at 127.0.0.2:port for the node at
// 127.0.0.1:port (a server's book entry names it with dist_options::advertise_host; a worker
// dials the scheduler there with scheduler_host). The first `lost` connections
// are taken and every byte on them dropped, as when a link loses the handshake's packets; later
// ones are relayed both ways.
class lossy_link {
 public:
  lossy_link(std::uint16_t port, int lost)
      : port_(port), lost_(lost), acc_(io_, {asio::ip::make_address("127.0.0.2"), port}) {
    accept_next();
    thread_ = std::thread([this] { io_.run_for(60s); });
  }
  ~lossy_link() {
    io_.stop();
    thread_.join();
  }
  int accepted() const { return accepted_; }

 private:
  void accept_next() {
    auto a = std::make_shared<tcp::socket>(io_);
    acc_.async_accept(*a, [this, a](boost::system::error_code ec) {
      if (ec) return;
      if (accepted_++ < lost_) {
        kvtest::pipe_bytes(a, nullptr);  // read and dropped
      } else {
        auto b = std::make_shared<tcp::socket>(io_);
        b->connect({asio::ip::make_address("127.0.0.1"), port_}, ec);
        if (!ec) {
          kvtest::pipe_bytes(a, b);
          kvtest::pipe_bytes(b, a);
        }
      }
      accept_next();
    });
  }
  std::uint16_t port_;
  int lost_;
  std::atomic<int> accepted_{0};
  asio::io_context io_;
  tcp::acceptor acc_;
  std::thread thread_;
};

}  // namespace

// ---- a worker in a child process (this test binary, re-executed with a test-case filter) -------
// With KVTEST_CHILD_WORKER set this case is a dist worker configured from the environment: it
// inits key 1, pushes one round, checks the pull, prints "ready" and then sleeps until killed.
// Without it (every normal run) it does nothing.
TEST_CASE("child worker process (runs only when re-executed by the killed-worker test)" *
          doctest::timeout(90)) {
  if (!std::getenv("KVTEST_CHILD_WORKER")) return;
  int rc = 0;
  try {
    KVStore<dist> kv;  // from the environment
    kv.init(1, filled(4, 0.0f));
    kv.push(1, filled(4, 2.0f)).wait();
    std::vector<float> out(4);
    kv.pull(1, out).wait();
    if (out != filled(4, 3.0f)) throw std::runtime_error("wrong value after round 1");
    std::printf("\nready\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));
  } catch (const std::exception& e) {
    std::printf("\nchild failed: %s\n", e.what());
    std::fflush(stdout);
    rc = 1;
  }
  std::_Exit(rc);
}

TEST_CASE("a scheduler address that can never resolve fails at once, not at the connect deadline" *
          doctest::timeout(30)) {
  for (const char* host : {"http://x", "[::1]:9091", "a b", "", "x..y"}) {
    kvstore::dist_options o;
    o.scheduler_host = host;
    o.scheduler_port = 9;
    o.connect_timeout = std::chrono::milliseconds(20'000);
    const auto t0 = std::chrono::steady_clock::now();
    expect_error([&] { KVStore<dist> kv(o); }, errc::invalid_argument,
                 {"scheduler", "not a host name or an IP address"});
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  }
}

namespace {

// Worker w joins through a lossy_link in front of port `port` that takes the first two
// connections: each handshake waits out handshake_timeout, the third gets through, and the
// worker trains one round.
void join_after_two_lost(const kvstore::dist_options& w, std::uint16_t port) {
  lossy_link link(port, 2);
  const auto t0 = clk::now();
  {
    KVStore<dist> kv(w);
    kv.init(1, filled(4, 0.0f));
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = -1.0});
    kv.push(1, filled(4, 2.0f)).wait();
    std::vector<float> out(4);
    kv.pull(1, out).wait();
    CHECK(out == filled(4, 2.0f));
  }
  CHECK(link.accepted() == 3);
  CHECK(seconds_since(t0) >= 0.6);  // each lost handshake waited out handshake_timeout
}

// Worker w, in front of whose `node` at port `port` every connection is lost: its join fails by
// connect_timeout, naming the node and why.
void join_fails_all_lost(kvstore::dist_options w, std::uint16_t port, const char* node) {
  lossy_link link(port, 1000);
  w.connect_timeout = 1500ms;
  const auto t0 = clk::now();
  expect_error([&] { KVStore<dist> kv(w); }, errc::unreachable,
               {node, "closed during its handshake", "no authentication within 300 ms", "attempt"});
  const double took = seconds_since(t0);
  MESSAGE("failed after " << took << " s and " << link.accepted() << " connections");
  CHECK(link.accepted() >= 2);
  CHECK(took < 1.5 + 0.3 + 1.0);
}

// The worker of 1 x 1 cluster options `cluster`, with a handshake_timeout short enough that each
// lost handshake costs 300 ms.
kvstore::dist_options relayed_worker(const kvstore::dist_options& cluster) {
  auto w = cluster;
  w.role = kvstore::role::worker;
  w.rank_hint = 0;
  w.handshake_timeout = 300ms;
  return w;
}

}  // namespace

TEST_CASE(
    "a server handshake the link cut short: the worker's join connects again and trains; "
    "past connect_timeout it fails naming the server and why" *
    doctest::timeout(60)) {
  auto o = kvtest::test_options(1, 1);
  o.advertise_host = "127.0.0.2";  // the servers' book entries: the lossy link
  o.auth_bind_address = false;     // a relayed connection's proof names the relay's address
  kvtest::cluster c(o);
  const auto w = relayed_worker(c.options());
  SUBCASE("two handshakes lost, the third gets through") {
    join_after_two_lost(w, c.server(0).port());
  }
  SUBCASE("every handshake lost: join fails by connect_timeout, naming the server and why") {
    join_fails_all_lost(w, c.server(0).port(), "server 0 (node 8)");
  }
}

TEST_CASE(
    "a scheduler handshake the link cut short: the worker's join connects again and trains; "
    "past connect_timeout it fails naming the scheduler and why" *
    doctest::timeout(60)) {
  auto o = kvtest::test_options(1, 1);
  o.auth_bind_address = false;  // a relayed connection's proof names the relay's address
  kvtest::cluster c(o);
  auto w = relayed_worker(c.options());
  w.scheduler_host = "127.0.0.2";  // the lossy link, in front of the scheduler
  SUBCASE("two handshakes lost, the third gets through") {
    join_after_two_lost(w, w.scheduler_port);
  }
  SUBCASE("every handshake lost: join fails by connect_timeout, naming the scheduler and why") {
    join_fails_all_lost(w, w.scheduler_port, "scheduler (node 1)");
  }
}

TEST_CASE("misuse is a kvstore::error naming the key, and the servers keep serving everyone" *
          doctest::timeout(30)) {
  auto o = kvtest::test_options(2, 2);
  o.slice_bytes = 64;
  kvtest::cluster c(o);
  const auto k = key_on(1, 2, 4, o.slice_bytes);
  c.run_workers([&](KVStore<dist>& kv) {
    kv.init(k, filled(4, 1.0f));
    kv.init("m", filled(40, 0.0f), 4);  // 10 rows of 4, sliced over both servers
    std::vector<float> out(4), rows2(8);
    if (kv.rank() == 0) {
      expect_error([&] { kv.pull(424242, out); }, errc::unknown_key, {"424242"});
      expect_error([&] { kv.push("ghost", filled(4, 1.0f)); }, errc::unknown_key, {"\"ghost\""});
      expect_error([&] { kv.push(k, filled(5, 1.0f)); }, errc::size_mismatch,
                   {std::to_string(k), "5"});
      expect_error([&] { kv.pull(k, rows2); }, errc::size_mismatch, {std::to_string(k), "8"});
      std::vector<std::int64_t> far{2, 10}, ok{1, 2};
      expect_error([&] { kv.pull_rows("m", far, rows2); }, errc::row_out_of_range,
                   {"\"m\"", "row 10"});
      expect_error([&] { kv.push_rows(k, ok, rows2); }, errc::not_a_matrix, {std::to_string(k)});
    }
    // init twice: refused on every worker, and the value is untouched.
    expect_error([&] { kv.init(k, filled(4, 5.0f)); }, errc::already_inited, {std::to_string(k)});
    kv.push(k, filled(4, static_cast<float>(kv.rank() + 1))).wait();
    kv.pull(k, out).wait();
    CHECK(out == filled(4, 3.0f));
  });
}

TEST_CASE(
    "a server refuses bad requests with an error answer naming the key, and keeps the connection" *
    doctest::timeout(30)) {
  // Worker 1 is this test's own scripted client: it registers with the scheduler like a worker
  // (its address book brings the credential its hello proves rank 1 with), and says bye to the
  // server before closing, so the real worker 0's rounds go on without it.
  auto o = kvtest::test_options(2, 1);
  o.dead_timeout = std::chrono::milliseconds(60'000);  // the scripted worker sends no heartbeats
  kvtest::cluster c(o);
  raw_client sched(c.options().scheduler_port);
  REQUIRE(sched.handshake());
  auto reg = hdr(kvstore::wire::cmd::reg);
  REQUIRE(sched.send_frame(
      reg, kvstore::wire::encode_registration({kvstore::role::worker, 1, "", 0, 2, 1})));
  auto wo = c.options();
  wo.role = kvstore::role::worker;
  wo.rank_hint = 0;
  {
    KVStore<dist> kv(wo);
    kvstore::wire::header bh;
    std::string bm;
    REQUIRE(sched.read_frame(bh, bm));
    REQUIRE(bh.command == kvstore::wire::cmd::address_book);
    REQUIRE(bh.aux == 1);
    const auto book = kvstore::wire::decode_address_book(bm);
    REQUIRE(book.servers.size() == 1);
    kv.init(5, filled(4, 7.0f));
    raw_client rc(c.server(0).port());
    REQUIRE(rc.handshake());
    auto hello = hdr(kvstore::wire::cmd::hello);
    hello.aux = 1;
    REQUIRE(rc.send_frame(hello, kvstore::transport::hello_proof(book.credential, rc.binding,
                                                                 book.servers[0].id, 1)));
    auto expect_refusal = [&](kvstore::wire::header h, std::uint64_t req, errc code,
                              const std::string& part, const std::string& meta = {}) {
      h.req_id = req;
      REQUIRE(rc.send_frame(h, meta));
      kvstore::wire::header ans;
      std::string msg;
      REQUIRE(rc.read_frame(ans, msg));
      CHECK(ans.command == kvstore::wire::cmd::response);
      CHECK(ans.req_id == req);
      CHECK_MESSAGE(ans.status == static_cast<std::uint32_t>(code), msg);
      CHECK_MESSAGE(msg.find(part) != std::string::npos, msg);
    };
    auto pull = hdr(kvstore::wire::cmd::pull);
    pull.key = 31337;
    pull.total = 4;
    pull.type = kvstore::wire::dtype::f32;
    expect_refusal(pull, 1, errc::unknown_key, "31337");
    pull.key = 5;
    pull.total = 9;
    expect_refusal(pull, 2, errc::size_mismatch, "5");
    auto rows = hdr(kvstore::wire::cmd::pull_rows);
    rows.key = 5;
    rows.total = 4;
    rows.type = kvstore::wire::dtype::f32;
    std::int64_t r0 = 0;
    expect_refusal(rows, 3, errc::not_a_matrix, "5", kvstore::wire::encode_rows(&r0, 1));
    auto bye = hdr(kvstore::wire::cmd::bye);
    bye.req_id = 4;
    REQUIRE(rc.send_frame(bye));
    kvstore::wire::header ans;
    std::string msg;
    REQUIRE(rc.read_frame(ans, msg));
    CHECK(ans.status == 0);
    // The real worker is unaffected.
    std::vector<float> out(4);
    kv.push(5, filled(4, 2.0f)).wait();
    kv.pull(5, out).wait();
    CHECK(out == filled(4, 2.0f));
  }
}

TEST_CASE("garbage on a server's or the scheduler's port is dropped; real workers carry on" *
          doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 2);
  o.max_frame_bytes = std::size_t{16} << 20;
  o.handshake_timeout = std::chrono::milliseconds(1000);
  kvtest::cluster c(o);
  std::atomic<bool> garbage_done{false}, quit{false};
  std::atomic<int> rounds{0};
  std::atomic<int> end_round{1 << 30};
  std::thread attacker([&] {
    // Wait until the workers are at work.
    while (rounds < 3 && !quit) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<std::uint16_t> ports{c.server(0).port(), c.server(1).port(),
                                     c.options().scheduler_port};
    std::mt19937 rng(42);
    for (auto port : ports) {
      CAPTURE(port);
      {  // random bytes
        raw_client rc(port);
        std::string junk(4096, '\0');
        for (auto& ch : junk) ch = static_cast<char>(rng());
        junk[0] = 'X';  // never the magic by chance
        rc.send_bytes(junk.data(), junk.size());
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
      {  // a valid header announcing a payload far above the limit: refused before allocating
        raw_client rc(port);
        auto h = hdr(kvstore::wire::cmd::hello);
        auto b = kvstore::wire::encode(h);
        kvstore::wire::detail::put64(b.data() + 16, std::uint64_t{1} << 40);
        rc.send_bytes(b.data(), b.size());
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
      {  // just above the configured maximum frame
        raw_client rc(port);
        auto h = hdr(kvstore::wire::cmd::hello);
        auto b = kvstore::wire::encode(h);
        kvstore::wire::detail::put64(b.data() + 16, (std::uint64_t{16} << 20) + 4);
        rc.send_bytes(b.data(), b.size());
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
      {  // huge metadata length
        raw_client rc(port);
        auto b = kvstore::wire::encode(hdr(kvstore::wire::cmd::hello));
        kvstore::wire::detail::put32(b.data() + 12, 0xFFFFFFFFu);
        rc.send_bytes(b.data(), b.size());
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
      {  // wrong magic
        raw_client rc(port);
        auto b = kvstore::wire::encode(hdr(kvstore::wire::cmd::hello));
        kvstore::wire::detail::put32(b.data(), 0x12345678u);
        rc.send_bytes(b.data(), b.size());
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
      {  // wrong version
        raw_client rc(port);
        auto b = kvstore::wire::encode(hdr(kvstore::wire::cmd::hello));
        kvstore::wire::detail::put16(b.data() + 4, 77);
        rc.send_bytes(b.data(), b.size());
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
      {  // unknown command
        raw_client rc(port);
        auto b = kvstore::wire::encode(hdr(kvstore::wire::cmd::hello));
        kvstore::wire::detail::put16(b.data() + 6, 999);
        rc.send_bytes(b.data(), b.size());
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
      {  // a well-formed frame that is not the first frame a peer must send
        raw_client rc(port);
        auto h = hdr(kvstore::wire::cmd::push);
        h.key = 1;
        h.total = 1;
        h.type = kvstore::wire::dtype::f32;
        rc.send_frame(h, {}, std::string(4, '\0'));
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
      {  // a slow drip of a bad header, one byte every 5 ms, then dropped when it is complete
        raw_client rc(port);
        auto b = kvstore::wire::encode(hdr(kvstore::wire::cmd::hello));
        kvstore::wire::detail::put32(b.data(), 0xDEADBEEFu);
        for (auto byte : b) {
          rc.send_bytes(&byte, 1);
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
      }
    }
    {  // a proof for the wrong token
      raw_client rc(c.server(0).port());
      CHECK_FALSE(rc.handshake("not the token"));  // refused: no acceptor proof comes back
      CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
    }
    {  // a hello that claims a worker rank the job does not have
      raw_client rc(c.server(0).port());
      CHECK(rc.handshake());
      auto h = hdr(kvstore::wire::cmd::hello);
      h.aux = 1000;
      rc.send_frame(h);
      CHECK(rc.closed_by_peer(std::chrono::seconds(5)));
    }
    {  // a client that stalls half-way through its first frame is dropped at the handshake deadline
      raw_client stalled(c.server(1).port());
      auto b = kvstore::wire::encode(hdr(kvstore::wire::cmd::auth));
      stalled.send_bytes(b.data(), 40);
      const auto t0 = clk::now();
      CHECK(stalled.closed_by_peer(std::chrono::seconds(5)));
      CHECK(seconds_since(t0) >= 0.5);
    }
    garbage_done = true;
    while (!quit)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // until the workers finish
  });
  try {
    c.run_workers([&](KVStore<dist>& kv) {
      kv.init(1, filled(3, 0.0f));
      kv.init("big", filled(1 << 16, 0.0f));  // 256 KiB
      std::vector<float> out(3), big(1 << 16);
      const auto started = clk::now();
      // Rounds continue through the whole attack, and five after it. Rank 0 decides the last
      // round before a barrier; the others read it after (one decision, seen by all).
      for (int round = 1; round <= end_round.load(); ++round) {
        const float f = static_cast<float>(round);
        const auto a = filled(3, f * static_cast<float>(kv.rank() + 1));
        const auto g = filled(1 << 16, f);
        kv.push(1, a);
        kv.push("big", g);
        kv.pull(1, out);
        kv.pull("big", big).wait();
        kv.wait_all();
        REQUIRE(out == filled(3, 3 * f));
        REQUIRE(big == filled(1 << 16, 2 * f));
        if (kv.rank() == 0) {
          rounds = round;
          if (garbage_done && end_round == (1 << 30)) end_round = round + 5;
        }
        kv.barrier();
        if (seconds_since(started) > 40) FAIL("the attack never finished");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  } catch (...) {
    quit = true;
    attacker.join();
    throw;
  }
  quit = true;
  attacker.join();
  CHECK(rounds > 5);
}

TEST_CASE(
    "a server stopped mid-job fails pending and later ops naming it, quickly; the rest goes on" *
    doctest::timeout(40)) {
  auto o = kvtest::test_options(2, 2);
  o.slice_bytes = 64;
  kvtest::cluster c(o);
  const auto on1 = key_on(1, 2, 4, o.slice_bytes), on0 = key_on(0, 2, 4, o.slice_bytes);
  std::atomic<int> step{0};
  std::atomic<double> failed_after{-1};
  c.run_workers([&](KVStore<dist>& kv) {
    kv.set_barrier_before_exit(true);
    kv.init(on1, filled(4, 1.0f));
    kv.init(on0, filled(4, 1.0f));
    kv.init("big", filled(100, 1.0f));  // sliced over both
    kv.barrier();
    if (kv.rank() == 0) {
      // Worker 1 never pushes this round: the push stays pending until server 1 is gone.
      const auto g = filled(4, 5.0f);
      auto p = kv.push(on1, g);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      CHECK_FALSE(p.ready());
      step = 1;
      while (step < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const auto t0 = clk::now();
      expect_error([&] { p.wait(); }, errc::node_dead,
                   {"server 1", "push of key " + std::to_string(on1)});
      failed_after = seconds_since(t0);
    } else {
      while (step < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      c.server(1).stop();
      step = 2;
    }
    kv.barrier();
    // Later ops on the lost server fail at once, naming it; whole-key pulls of a sliced key too.
    std::vector<float> out(4), big(100);
    auto t1 = clk::now();
    expect_error([&] { kv.pull(on1, out).wait(); }, errc::node_dead, {"server 1"});
    expect_error([&] { kv.pull("big", big).wait(); }, errc::node_dead, {"server 1"});
    CHECK(seconds_since(t1) < 2.0);
    // Server 0 still runs its sync rounds.
    const auto g = filled(4, static_cast<float>(kv.rank() + 1));
    kv.push(on0, g).wait();
    kv.pull(on0, out).wait();
    CHECK(out == filled(4, 3.0f));
  });
  CHECK(failed_after >= 0.0);
  CHECK(failed_after < 5.0);  // detected, not left to the 20 s request deadline
}

TEST_CASE("a sync round that cannot complete fails at the request deadline, naming the server" *
          doctest::timeout(30)) {
  auto o = kvtest::test_options(2, 1);
  o.request_timeout = std::chrono::milliseconds(800);
  kvtest::cluster c(o);
  c.run_workers([&](KVStore<dist>& kv) {
    kv.init(3, filled(2, 0.0f));
    if (kv.rank() == 0) {
      const auto t0 = clk::now();
      const auto g = filled(2, 1.0f);
      expect_error([&] { kv.push(3, g).wait(); }, errc::timeout,
                   {"push of key 3", "server 0", "800 ms"});
      const double s = seconds_since(t0);
      CHECK(s >= 0.7);
      CHECK(s < 5.0);
    }
    kv.barrier();
  });
}

TEST_CASE("a worker process killed mid-round: the others' sync push and barrier fail naming it" *
          doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 1);
  o.on_worker_death = kvstore::worker_death::fail;  // the default, leave_group, lets the rest go on
  kvtest::cluster c(o);
  kvtest::temp_dir dir{"kvstore-dist-faults"};
  const std::string child_out = dir / "child.out";
  auto env = kvtest::clean_environment();
  env.insert(env.end(),
             {"KVTEST_CHILD_WORKER=1", "KVSTORE_ROLE=worker",
              "KVSTORE_SCHEDULER=127.0.0.1:" + std::to_string(c.options().scheduler_port),
              "KVSTORE_NUM_WORKERS=2", "KVSTORE_NUM_SERVERS=1", "KVSTORE_RANK=1",
              "KVSTORE_ON_WORKER_DEATH=fail"});
  kvtest::child child = kvtest::spawn({"/proc/self/exe", "--test-case=child worker process*"},
                                      std::move(env), child_out);

  auto wo = c.options();
  wo.role = kvstore::role::worker;
  wo.rank_hint = 0;
  KVStore<dist> kv(wo);
  kv.set_barrier_before_exit(false);
  REQUIRE(kv.rank() == 0);
  kv.init(1, filled(4, 0.0f));
  kv.push(1, filled(4, 1.0f)).wait();  // round 1 with the child: 1 + 2
  std::vector<float> out(4);
  kv.pull(1, out).wait();
  CHECK(out == filled(4, 3.0f));
  // Wait for the child's "ready".
  std::string line;
  kvtest::wait_until(
      [&] {
        line = kvtest::read_file(child_out);
        return line.find("ready\n") != std::string::npos ||
               line.find("failed") != std::string::npos;
      },
      std::chrono::seconds(20));
  REQUIRE_MESSAGE(line.find("\nready\n") != std::string::npos, line);
  CHECK(kv.num_dead_node(4, 60) == 0);
  // Round 2: only this worker pushes, then the child dies.
  const auto g = filled(4, 1.0f);
  auto p = kv.push(1, g);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(p.ready());
  const auto t0 = clk::now();
  child.signal(SIGKILL);
  expect_error([&] { p.wait(); }, errc::node_dead, {"worker 1"});
  CHECK(seconds_since(t0) < 5.0);
  expect_error([&] { kv.barrier(); }, errc::node_dead, {"worker 1"});
  CHECK(seconds_since(t0) < 5.0);
  CHECK(kv.num_dead_node(4, 60) == 1);
  CHECK(kv.num_dead_node(2, 60) == 0);
}

TEST_CASE("a scheduler whose accept fails with EMFILE keeps accepting once descriptors are back" *
          doctest::timeout(60)) {
  kvtest::cluster c(kvtest::test_options(1, 1));
  std::this_thread::sleep_for(300ms);  // the server registers before the descriptors run out
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  // Every descriptor of this process taken but one, which the connecting socket takes: the
  // scheduler's accept of it then has none left (EMFILE).
  rlimit low = saved;
  low.rlim_cur = 512;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> filler;
  for (int i = 0; i < 1024; ++i) {
    const int fd = ::open("/dev/null", O_RDONLY);
    if (fd < 0) break;
    filler.push_back(fd);
  }
  const bool exhausted = ::open("/dev/null", O_RDONLY) < 0 && errno == EMFILE;
  REQUIRE(!filler.empty());
  ::close(filler.back());
  filler.pop_back();
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(c.options().scheduler_port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool connected =
      probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  const bool met_emfile = kvtest::wait_until([&] { return c.scheduler().accept_errors() > 0; }, 5s);
  for (int fd : filler) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &saved);
  CHECK(exhausted);
  CHECK(connected);
  CHECK(met_emfile);
  // The accept loop retries: the job gathers and serves exactly.
  c.run_workers([](KVStore<dist>& kv) {
    kv.init(4, filled(16, 1.0f));
    kv.push(4, filled(16, 2.0f)).wait();
    std::vector<float> out(16);
    kv.pull(4, out).wait();
    CHECK(out == filled(16, 2.0f));
  });
  if (probe >= 0) ::close(probe);
}
