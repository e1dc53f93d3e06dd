// A hostile peer against real kv_server processes (issue 10): a worker of the job that holds the
// token and its own credential, but sends what a broken or malicious program would. Every attack
// is bounded and checks that the server's resident memory stays under the bound its limits
// promise (read from /proc while the attack holds), that the server keeps serving, and that a
// real worker's values stay exact. Also: a scheduler whose accept hits its descriptor limit
// (EMFILE) under a connection flood serves the real job once the flood is gone, and a flood of
// unauthenticated connections held open does not keep a real job out.
#include <kvstore/dist.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"
#include "support/process.hpp"
#include "support/wire_peer.hpp"

#include <kvstore/wire/messages.hpp>  // what a hostile worker sends, by hand

#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#ifndef KV_SERVER_PATH
#error "KV_SERVER_PATH must name the kv_server binary"
#endif

using namespace std::chrono_literals;
using kvstore::dist;
using kvstore::errc;
using kvstore::KVStore;
using kvtest::filled;
namespace wire = kvstore::wire;

namespace {

const std::string token = "hostile-test-token";
constexpr std::size_t mib = std::size_t{1} << 20;
// The server's answer queue per peer is capped at this (KVSTORE_MAX_QUEUED_BYTES) in these tests.
constexpr std::size_t queued_cap = 4 * mib;

// VmRSS of process `pid` in bytes (0 if unreadable).
std::size_t rss_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string word;
  while (f >> word)
    if (word == "VmRSS:") {
      std::size_t kib = 0;
      f >> kib;
      return kib * 1024;
    }
  return 0;
}

// The largest RSS seen over `span`, sampled every 20 ms.
std::size_t peak_rss(pid_t pid, std::chrono::milliseconds span) {
  std::size_t peak = rss_of(pid);
  const auto until = std::chrono::steady_clock::now() + span;
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
    peak = std::max(peak, rss_of(pid));
  }
  return peak;
}

struct proc : kvtest::child {
  std::string log;
  std::string output() const { return kvtest::read_file(log); }
};

std::vector<std::string> job_env(const std::string& role, std::uint16_t port, int workers,
                                 std::vector<std::string> more = {}) {
  std::vector<std::string> e = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                                "KVSTORE_LOG=1",
                                "KVSTORE_ROLE=" + role,
                                "KVSTORE_SCHEDULER=127.0.0.1:" + std::to_string(port),
                                "KVSTORE_NUM_WORKERS=" + std::to_string(workers),
                                "KVSTORE_NUM_SERVERS=1",
                                "KVSTORE_TOKEN=" + token,
                                "KVSTORE_TYPE=dist_async",
                                "KVSTORE_DEAD_TIMEOUT_MS=600000",
                                "KVSTORE_MAX_QUEUED_BYTES=" + std::to_string(queued_cap)};
  for (auto& m : more)
    if (m.rfind("KVSTORE_TYPE=", 0) == 0) std::erase(e, std::string("KVSTORE_TYPE=dist_async"));
  e.insert(e.end(), more.begin(), more.end());
  return e;
}

proc start(const kvtest::temp_dir& dir, const std::string& name, std::vector<std::string> argv,
           std::vector<std::string> env) {
  const std::string log = dir / (name + ".log");
  return {kvtest::spawn(std::move(argv), std::move(env), log, log), log};
}

kvstore::dist_options worker_options(std::uint16_t port, int workers, int rank, bool sync = false) {
  auto o = kvtest::test_options(workers, 1, sync);
  o.scheduler_port = port;
  o.rank_hint = rank;
  o.token = token;
  o.dead_timeout = 600s;
  return o;
}

// Whether something accepts TCP connections on 127.0.0.1:port.
bool listening(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// The frame a worker would send, as bytes (header, meta, payload).
std::string frame_bytes(wire::header h, const std::string& meta = {},
                        const std::string& payload = {}) {
  h.meta_len = static_cast<std::uint32_t>(meta.size());
  h.payload_len = payload.size();
  const auto b = wire::encode(h);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size()) + meta + payload;
}

// A job of one kv_server scheduler and one kv_server server, whose worker 0 is a real
// KVStore<dist> in this process and whose worker 1 is this test's scripted peer; dist_async
// unless `sync`.
struct hostile_job {
  explicit hostile_job(bool sync = false) : sync(sync) { join(); }

  bool sync;
  std::string type = sync ? "KVSTORE_TYPE=dist_sync" : "KVSTORE_TYPE=dist_async";
  kvtest::temp_dir dir{"kvstore-hostile"};
  std::uint16_t port = kvtest::free_port();
  proc scheduler = start(dir, "scheduler",
                         {KV_SERVER_PATH, "--role", "scheduler", "--port", std::to_string(port)},
                         job_env("scheduler", port, 2, {type}));
  proc server = start(dir, "server", {KV_SERVER_PATH, "--role", "server"},
                      job_env("server", port, 2, {"KVSTORE_RANK=0", type}));
  bool up = kvtest::wait_until([&] { return listening(port); }, 10s);
  kvtest::wire_peer registrar{port};  // worker 1's registration with the scheduler
  wire::address_book book;
  std::unique_ptr<KVStore<dist>> kv;

  void join() {
    REQUIRE(up);
    REQUIRE(registrar.handshake(token));
    REQUIRE(
        registrar.send_frame(kvtest::hdr(wire::cmd::reg),
                             wire::encode_registration({kvstore::role::worker, 1, "", 0, 2, 1})));
    kv = std::make_unique<KVStore<dist>>(worker_options(port, 2, 0, sync));
    wire::header h;
    std::string meta;
    REQUIRE(registrar.read_frame(h, meta));
    REQUIRE(h.command == wire::cmd::address_book);
    book = wire::decode_address_book(meta);
    REQUIRE(book.servers.size() == 1);
  }
  // A new connection of worker 1 to the server, past the handshake and its hello. It replaces
  // worker 1's previous connection (the server keeps one per worker).
  std::unique_ptr<kvtest::wire_peer> peer() {
    auto p = std::make_unique<kvtest::wire_peer>(book.servers[0].port);
    REQUIRE(p->handshake(token));
    REQUIRE(p->hello(1, book.credential, book.servers[0].id));
    return p;
  }
  std::size_t rss() const { return rss_of(server.pid()); }
  std::string logs() const {
    return "--- scheduler\n" + scheduler.output() + "--- server\n" + server.output();
  }
};

wire::header request(wire::cmd c, std::uint64_t key, std::uint64_t total, std::uint64_t req) {
  wire::header h = kvtest::hdr(c);
  h.key = key;
  h.total = total;
  h.type = wire::dtype::f32;
  h.req_id = req;
  return h;
}

}  // namespace

TEST_CASE("a worker that floods, stalls and over-asks: server memory stays bounded, values exact" *
          doctest::timeout(120)) {
  hostile_job job;
  INFO(job.logs());
  KVStore<dist>& kv = *job.kv;
  constexpr std::size_t big = mib / 4;               // key 1: 1 MiB of floats
  constexpr std::size_t rows = 256, row_len = 1024;  // key 2: 256 rows of 4 KiB
  kv.init(1, filled(big, 1.0f));
  std::vector<float> matrix(rows * row_len);
  for (std::size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<float>(i / row_len);
  kv.init(2, matrix, row_len);
  kv.init(3, filled(1, 0.0f));
  const std::size_t base = job.rss();
  REQUIRE(base > 0);
  std::size_t worst = 0;  // the largest growth over `base` any attack caused
  auto measure = [&](const std::string& what, std::chrono::milliseconds span) {
    const std::size_t peak = peak_rss(job.server.pid(), span);
    const std::size_t grew = peak > base ? peak - base : 0;
    MESSAGE(what << ": server RSS +" << grew / 1024 << " KiB");
    worst = std::max(worst, grew);
    return grew;
  };

  SUBCASE("frames announcing more than they send, or more than max_frame_bytes") {
    auto p = job.peer();
    // An init of a new 15 M-float key announcing 60 MiB of payload, of which 96 bytes come.
    wire::header h = request(wire::cmd::init, 9, 15'000'000, 1);
    h.flags = wire::flag_last | wire::flag_has_data;
    const std::string meta = wire::encode_init_meta({0, 15'000'000});
    h.meta_len = static_cast<std::uint32_t>(meta.size());
    h.payload_len = 60'000'000;
    const auto hb = wire::encode(h);
    REQUIRE(p->send_bytes(hb.data(), hb.size()));
    REQUIRE(p->send_bytes(meta.data(), meta.size()));
    REQUIRE(p->send_bytes(std::string(96, '\1').data(), 96));
    CHECK(measure("60 MiB init announced, 96 bytes sent, stalled", 1500ms) < 16 * mib);
    // One announcing 1 GiB is refused on its header: the connection closes.
    auto q = job.peer();
    wire::header g = request(wire::cmd::push, 1, big, 2);
    g.payload_len = std::uint64_t{1} << 30;
    const auto gb = wire::encode(g);
    REQUIRE(q->send_bytes(gb.data(), gb.size()));
    CHECK(q->closed_by_peer(5s));
  }
  SUBCASE("pull_rows naming one row 50,000 times is refused, not copied 50,000 times") {
    auto p = job.peer();
    const std::vector<std::int64_t> same(50'000, 7);
    for (std::uint64_t i = 1; i <= 4; ++i) {
      REQUIRE(p->send_frame(request(wire::cmd::pull_rows, 2, rows * row_len, i),
                            wire::encode_rows(same.data(), same.size())));
      wire::header a;
      std::string msg;
      REQUIRE(p->read_frame(a, msg));
      CHECK(a.command == wire::cmd::response);
      CHECK(a.status == static_cast<std::uint32_t>(errc::invalid_argument));
      CHECK(msg.find("row 7") != std::string::npos);
    }
    CHECK(measure("pull_rows of one row x 50,000, 4 times", 500ms) < 16 * mib);
  }
  SUBCASE("pulls whose answers are never read: back-pressure, not a growing queue") {
    auto p = job.peer();
    const std::size_t sent = p->flood(frame_bytes(request(wire::cmd::pull, 1, big, 5)), 4s, 500ms);
    MESSAGE("pulls of a 1 MiB key sent before the server stopped reading: " << sent);
    CHECK(sent < 100'000);  // the server stopped taking requests
    CHECK(measure("unread pulls of a 1 MiB key", 500ms) < queued_cap + 16 * mib);
  }
  SUBCASE("pull_rows answers never read: each answer copies rows, the queue is still bounded") {
    auto p = job.peer();
    std::vector<std::int64_t> all(rows);
    for (std::size_t r = 0; r < rows; ++r) all[r] = static_cast<std::int64_t>(r);
    const std::size_t sent =
        p->flood(frame_bytes(request(wire::cmd::pull_rows, 2, rows * row_len, 6),
                             wire::encode_rows(all.data(), all.size())),
                 4s, 500ms);
    MESSAGE("pull_rows of 1 MiB each sent before the server stopped reading: " << sent);
    // Unbounded, the answers of `sent` requests would be sent * 1 MiB.
    CHECK(measure("unread pull_rows of 256 x 4 KiB rows", 500ms) < queued_cap + 24 * mib);
  }
  SUBCASE("async pushes whose answers are never read") {
    auto p = job.peer();
    wire::header h = request(wire::cmd::push, 3, 1, 7);
    h.flags = wire::flag_last;
    const float one = 1.0f;
    const std::size_t sent =
        p->flood(frame_bytes(h, {}, std::string(reinterpret_cast<const char*>(&one), sizeof one)),
                 4s, 500ms);
    MESSAGE("async pushes sent: " << sent);
    CHECK(sent > 0);
    CHECK(measure("unread answers of async pushes", 500ms) < queued_cap + 16 * mib);
  }

  // The server served the attacks' requests and still serves the real worker exactly.
  std::vector<float> out(big);
  kv.pull(1, out).wait();
  CHECK(out == filled(big, 1.0f));
  std::vector<float> back(matrix.size());
  kv.pull(2, back).wait();
  CHECK(back == matrix);
  const std::vector<std::int64_t> ask{7, 7, 3};
  std::vector<float> some(ask.size() * row_len);
  kv.pull_rows(2, ask, some).wait();
  CHECK(some[0] == 7.0f);
  CHECK(some[row_len] == 7.0f);
  CHECK(some[2 * row_len] == 3.0f);
  kv.push(1, filled(big, 2.5f)).wait();  // dist_async without an optimizer: replaces
  kv.pull(1, out).wait();
  CHECK(out == filled(big, 2.5f));
  MESSAGE("server RSS before the attacks " << base / mib << " MiB, worst growth " << worst / 1024
                                           << " KiB");
  kv.set_barrier_before_exit(false);
}

TEST_CASE(
    "a worker pushing one key over and over in an open sync round: kept back within "
    "max_queued_bytes, then refused; the rounds stay exact" *
    doctest::timeout(120)) {
  hostile_job job(/*sync=*/true);
  INFO(job.logs());
  KVStore<dist>& kv = *job.kv;
  constexpr std::size_t big = mib / 4;  // key 1: 1 MiB of floats
  kv.init(1, filled(big, 0.0f));
  const std::size_t base = job.rss();
  REQUIRE(base > 0);
  auto p = job.peer();
  // Worker 1's pushes of 1.0: the first opens round 1 (worker 0 has not pushed), the next
  // ones wait behind it (the server keeps them, as it does a pipelining worker's), up to
  // max_queued_bytes (4 MiB here: 3 pushes and their bookkeeping); after that each is refused.
  wire::header h = request(wire::cmd::push, 1, big, 11);
  h.flags = wire::flag_last;
  const std::string ones = [] {
    std::vector<float> v(big, 1.0f);
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }();
  for (int i = 0; i < 40; ++i) {
    h.req_id = 100 + static_cast<std::uint64_t>(i);
    REQUIRE(p->send_frame(h, {}, ones));
  }
  // The refusals, naming the key and the limit; no answer to the kept pushes yet.
  int refused = 0;
  for (int i = 0; i < 36; ++i) {
    wire::header a;
    std::string msg;
    REQUIRE(p->read_frame(a, msg));
    CHECK(a.command == wire::cmd::response);
    CHECK(a.status == static_cast<std::uint32_t>(errc::invalid_argument));
    CHECK(a.req_id >= 104);
    refused += msg.find("key 1") != std::string::npos &&
               msg.find("KVSTORE_MAX_QUEUED_BYTES") != std::string::npos;
  }
  CHECK(refused == 36);
  const std::size_t peak = peak_rss(job.server.pid(), 500ms);
  MESSAGE("server RSS +" << (peak > base ? peak - base : 0) / 1024 << " KiB");
  CHECK(peak < base + 2 * queued_cap + 16 * mib);
  // Worker 0's push completes round 1 with worker 1's first push; its pull sees exactly that.
  kv.push(1, filled(big, 2.0f)).wait();
  std::vector<float> out(big);
  kv.pull(1, out).wait();
  CHECK(out == filled(big, 3.0f));
  // Round 2 holds worker 1's second push, its third and fourth wait: answered as worker 0 pushes.
  for (int r = 2; r <= 4; ++r) {
    kv.push(1, filled(big, 2.0f)).wait();
    wire::header a;
    std::string msg;
    REQUIRE(p->read_frame(a, msg));
    CHECK(a.status == static_cast<std::uint32_t>(errc::ok));
  }
  kv.pull(1, out).wait();
  CHECK(out == filled(big, 3.0f));
  CHECK(kv.version(1) == 4);
  kv.set_barrier_before_exit(false);
}

TEST_CASE("a scheduler with 48 descriptors, flooded with 150 connections, serves the job after" *
          doctest::timeout(120)) {
  kvtest::temp_dir dir{"kvstore-fdlimit"};
  const std::uint16_t port = kvtest::free_port();
  // 48 descriptors: both connection pools are fitted below that, so the flood is evicted from
  // its own pool instead of taking every descriptor (the EMFILE retry itself is tested in
  // test_dist_faults, where the test can take the descriptors away).
  auto sched = start(dir, "scheduler",
                     {"prlimit", "--nofile=48:48", KV_SERVER_PATH, "--role", "scheduler", "--port",
                      std::to_string(port)},
                     job_env("scheduler", port, 1));
  INFO(sched.output());
  std::vector<std::unique_ptr<kvtest::wire_peer>> flood;
  REQUIRE(kvtest::wait_until([&] { return listening(port); }, 5s));
  for (int i = 0; i < 150; ++i) flood.push_back(std::make_unique<kvtest::wire_peer>(port));
  std::this_thread::sleep_for(1500ms);
  flood.clear();  // the attacker leaves
  auto server = start(dir, "server", {KV_SERVER_PATH, "--role", "server"},
                      job_env("server", port, 1, {"KVSTORE_RANK=0"}));
  INFO(server.output());
  {
    KVStore<dist> kv(worker_options(port, 1, 0));
    kv.init(1, filled(8, 3.0f));
    kv.push(1, filled(8, 4.0f)).wait();
    std::vector<float> out(8);
    kv.pull(1, out).wait();
    CHECK(out == filled(8, 4.0f));
  }
  const std::string log = sched.output();
  CHECK(log.find("descriptor limit 48") != std::string::npos);
  CHECK(log.find("evicting the oldest") != std::string::npos);
}

TEST_CASE("1,000 unauthenticated connections held open do not keep a real job out" *
          doctest::timeout(120)) {
  // This process holds 1,000 sockets: raise its own descriptor limit first.
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 1200) {
    MESSAGE("skipped: the descriptor limit " << lim.rlim_cur << " is below 1200");
    return;
  }
  kvtest::temp_dir dir{"kvstore-pending"};
  const std::uint16_t port = kvtest::free_port();
  auto sched = start(dir, "scheduler",
                     {KV_SERVER_PATH, "--role", "scheduler", "--port", std::to_string(port)},
                     job_env("scheduler", port, 1));
  INFO(sched.output());
  REQUIRE(kvtest::wait_until([&] { return listening(port); }, 5s));
  std::vector<std::unique_ptr<kvtest::wire_peer>> flood;
  for (int i = 0; i < 1000; ++i) flood.push_back(std::make_unique<kvtest::wire_peer>(port));
  auto server = start(dir, "server", {KV_SERVER_PATH, "--role", "server"},
                      job_env("server", port, 1, {"KVSTORE_RANK=0"}));
  INFO(server.output());
  KVStore<dist> kv(worker_options(port, 1, 0));
  kv.init(1, filled(8, 3.0f));
  kv.push(1, filled(8, 5.0f)).wait();
  std::vector<float> out(8);
  kv.pull(1, out).wait();
  CHECK(out == filled(8, 5.0f));
  CHECK(rss_of(sched.pid()) < 64 * mib);
}
