// Identities bound to the authenticated connection, and job sizes checked at join: a peer that
// holds the token but not a worker's credential cannot speak as that worker (its hello is refused
// and its bye/leave/close change nothing), whether its hello comes before or after the server's
// address book; nodes whose KVSTORE_NUM_WORKERS differ from the scheduler's fail the job at once
// with an error naming both numbers; a job that cannot gather tells its workers why.
#include <kvstore/transport/identity.hpp>  // first: the header is self-contained
// The server and scheduler classes themselves (kvstore.hpp declares only kvstore::node_loop).
#include <kvstore/rendezvous/scheduler.hpp>
#include <kvstore/server/server.hpp>

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"

#include <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;
namespace transport = kvstore::transport;
namespace wire = kvstore::wire;

namespace {

// A peer that holds the job's token (it passes the connection handshake) and claims to be
// worker `rank` in its hello, with `proof` (empty: none), then says bye and leave as that rank.
// It never closes the connection itself: closed() says whether the server did.
class impostor final : public transport::frame_handler {
 public:
  impostor(const kvstore::dist_options& o, std::uint16_t port, int rank, std::string proof)
      : work_(io_.get_executor()) {
    tcp::socket s(io_);
    s.connect({asio::ip::make_address("127.0.0.1"), port});
    conn_ = std::make_shared<transport::tcp_connection>(std::move(s), *this, wire::limits{},
                                                        o.security(false));
    thread_ = std::thread([this] { io_.run(); });
    conn_->start();
    auto frame = [&](wire::cmd c, std::uint64_t req, std::string meta = {}) {
      transport::out_frame f;
      f.h.command = c;
      f.h.req_id = req;
      f.h.aux = static_cast<std::uint64_t>(rank);
      f.h.sender = kvstore::detail::worker_id(rank);
      f.meta = std::move(meta);
      conn_->send(std::move(f));
    };
    frame(wire::cmd::hello, 0, std::move(proof));
    frame(wire::cmd::bye, 1);
    frame(wire::cmd::leave, 2);
  }
  ~impostor() {
    conn_->close("test over");
    work_.reset();
    thread_.join();
  }

  /// True once the server closed the connection (within `limit`).
  bool closed_within(std::chrono::milliseconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (!closed_ && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);
    return closed_;
  }
  int answers() const { return answers_; }

  void on_frame(transport::connection&, const wire::header& h, std::string,
                std::span<const std::byte>) override {
    if (h.command == wire::cmd::response && h.status == 0) ++answers_;
  }
  void on_close(transport::connection&, const std::string&) override { closed_ = true; }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::shared_ptr<transport::connection> conn_;
  std::thread thread_;
  std::atomic<bool> closed_{false};
  std::atomic<int> answers_{0};
};

kvstore::dist_options tokened(int workers, int servers) {
  auto o = kvtest::test_options(workers, servers);
  o.token = "s3cret";
  o.bind_host = "127.0.0.1";
  return o;
}

// Sync rounds of two workers (values rank + 1): every pulled element must be exactly 3. Rank 0
// runs `mid` between rounds 3 and 4 (the other waits in its round meanwhile).
void rounds(kvtest::cluster& c, const std::function<void()>& mid) {
  c.run_workers([&](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> v(1000, 0.f), out(1000);
    kv.init(5, v);
    for (int round = 0; round < 12; ++round) {
      if (round == 4 && kv.rank() == 0) mid();
      std::vector<float> g(1000, static_cast<float>(kv.rank() + 1));
      kv.push(5, g).wait();
      kv.pull(5, out).wait();
      for (float x : out) REQUIRE(x == 3.f);
    }
    kv.barrier();
  });
}

}  // namespace

TEST_CASE("identity proofs: bound to the credential, the connection, the server and the rank" *
          doctest::timeout(10)) {
  const auto secret = transport::make_job_secret();
  CHECK(secret.size() == transport::identity_size);
  CHECK(secret != transport::make_job_secret());
  const int wid = kvstore::detail::worker_id(1);
  const auto cred = transport::node_credential(secret, wid);
  CHECK(cred.size() == transport::identity_size);
  CHECK(cred != transport::node_credential(secret, kvstore::detail::worker_id(0)));
  const std::string binding = "nonce-of-one-connection";
  const auto p = transport::hello_proof(cred, binding, 8, 1);
  CHECK(transport::check_hello_proof(secret, wid, 1, binding, 8, p));
  CHECK_FALSE(transport::check_hello_proof(secret, wid, 1, "another connection", 8, p));
  CHECK_FALSE(transport::check_hello_proof(secret, wid, 1, binding, 10, p));  // other server
  CHECK_FALSE(transport::check_hello_proof(secret, kvstore::detail::worker_id(0), 0, binding, 8,
                                           p));  // other rank
  CHECK_FALSE(
      transport::check_hello_proof(transport::make_job_secret(), wid, 1, binding, 8, p));  // job
  CHECK_FALSE(transport::check_hello_proof(secret, wid, 1, binding, 8, ""));
  CHECK_FALSE(transport::check_hello_proof(secret, wid, 1, binding, 8, p.substr(1)));
  auto q = p;
  q[0] = static_cast<char>(q[0] ^ 1);
  CHECK_FALSE(transport::check_hello_proof(secret, wid, 1, binding, 8, q));
}

TEST_CASE("a peer claiming worker 1 without its credential is closed; the real rounds are exact" *
          doctest::timeout(60)) {
  for (std::string proof : {std::string(), std::string(transport::identity_size, 'x')}) {
    CAPTURE(proof.size());
    kvtest::cluster c(tokened(2, 1));
    bool closed = false;
    int answers = -1;
    rounds(c, [&] {
      impostor bad(c.options(), c.server(0).port(), 1, proof);
      closed = bad.closed_within(5'000ms);
      answers = bad.answers();
    });
    CHECK(closed);
    CHECK(answers == 0);  // its bye and leave were never answered
  }
}

TEST_CASE("a hello that overtakes the server's address book is checked when the book arrives" *
          doctest::timeout(60)) {
  kvtest::cluster c(tokened(2, 1));
  // The job has not gathered (no worker yet): the server has no job secret to check with.
  impostor bad(c.options(), c.server(0).port(), 1, std::string(transport::identity_size, 'x'));
  CHECK_FALSE(bad.closed_within(300ms));
  rounds(c, [] {});
  CHECK(bad.closed_within(5'000ms));
  CHECK(bad.answers() == 0);
}

namespace {

// A scripted node over a real connection (token handshake included): sends whatever frames the
// test builds and keeps what it receives.
class peer final : public transport::frame_handler {
 public:
  peer(const kvstore::dist_options& o, std::uint16_t port) : work_(io_.get_executor()) {
    tcp::socket s(io_);
    s.connect({asio::ip::make_address("127.0.0.1"), port});
    conn_ = std::make_shared<transport::tcp_connection>(std::move(s), *this, wire::limits{},
                                                        o.security(false));
    thread_ = std::thread([this] { io_.run(); });
    conn_->start();
  }
  ~peer() {
    conn_->close("test over");
    work_.reset();
    thread_.join();
  }
  void send(wire::header h, std::string meta = {}, std::vector<float> payload = {}) {
    transport::out_frame f;
    f.h = h;
    f.meta = std::move(meta);
    auto keep = std::make_shared<std::vector<float>>(std::move(payload));
    f.payload = reinterpret_cast<const std::byte*>(keep->data());
    f.payload_len = keep->size() * sizeof(float);
    f.keep = keep;
    conn_->send(std::move(f));
  }
  /// The connection's binding, once the handshake is done.
  std::string binding() {
    for (int i = 0; i < 5000 && !conn_->authenticated(); ++i) std::this_thread::sleep_for(1ms);
    REQUIRE(conn_->authenticated());
    return conn_->binding();
  }
  /// The first frame received with command `c` (and request `req`, unless 0), within 10 s.
  std::pair<wire::header, std::string> wait_for(wire::cmd c, std::uint64_t req = 0) {
    for (int i = 0; i < 1000; ++i) {
      {
        std::lock_guard lk(m_);
        for (auto& [h, meta] : got_)
          if (h.command == c && (!req || h.req_id == req)) return {h, meta};
      }
      std::this_thread::sleep_for(10ms);
    }
    FAIL("no such frame within 10 s");
    return {};
  }
  bool closed_within(std::chrono::milliseconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (!closed_ && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);
    return closed_;
  }

  void on_frame(transport::connection&, const wire::header& h, std::string meta,
                std::span<const std::byte>) override {
    std::lock_guard lk(m_);
    got_.emplace_back(h, std::move(meta));
  }
  void on_close(transport::connection&, const std::string&) override { closed_ = true; }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::shared_ptr<transport::connection> conn_;
  std::thread thread_;
  std::mutex m_;
  std::vector<std::pair<wire::header, std::string>> got_;
  std::atomic<bool> closed_{false};
};

wire::header frame_of(wire::cmd c, std::uint64_t req = 0) {
  wire::header h;
  h.command = c;
  h.req_id = req;
  return h;
}

}  // namespace

TEST_CASE("a worker's newer connection replaces the older, whose close is no departure" *
          doctest::timeout(60)) {
  // Worker 1 is scripted: it registers like a worker (its book brings its credential), proves
  // its rank on two connections to the server, and pushes through the newer one.
  auto o = tokened(2, 1);
  o.dead_timeout = 60'000ms;  // the scripted worker sends no heartbeats
  kvtest::cluster c(o);
  peer sched(c.options(), c.options().scheduler_port);
  sched.send(frame_of(wire::cmd::reg, 1),
             wire::encode_registration({kvstore::role::worker, 1, "", 0, 2, 1}));
  auto wo = c.options();
  wo.role = kvstore::role::worker;
  wo.rank_hint = 0;
  kvstore::KVStore<kvstore::dist> kv(wo);
  const auto [bh, bm] = sched.wait_for(wire::cmd::address_book);
  REQUIRE(bh.aux == 1);
  const auto book = wire::decode_address_book(bm);
  REQUIRE(book.servers.size() == 1);
  REQUIRE(book.credential.size() == transport::identity_size);
  CHECK(book.job_secret.empty());  // a worker never learns the job secret
  kv.init(5, std::vector<float>(4, 0.f));

  auto hello = [&](peer& p) {
    auto h = frame_of(wire::cmd::hello);
    h.aux = 1;
    p.send(h, transport::hello_proof(book.credential, p.binding(), book.servers[0].id, 1));
  };
  peer older(c.options(), c.server(0).port());
  hello(older);
  peer newer(c.options(), c.server(0).port());
  hello(newer);
  CHECK(older.closed_within(5'000ms));  // replaced, and its close is not worker 1 leaving
  CHECK_FALSE(newer.closed_within(200ms));

  auto push = frame_of(wire::cmd::push, 7);
  push.key = 5;
  push.total = 4;
  push.type = wire::dtype::f32;
  push.flags = wire::flag_last;
  push.aux = 1;
  newer.send(push, {}, std::vector<float>(4, 2.f));
  std::vector<float> out(4);
  kv.push(5, std::vector<float>(4, 1.f)).wait();
  kv.pull(5, out).wait();
  CHECK(out == std::vector<float>(4, 3.f));  // both workers' pushes, summed
  CHECK(newer.wait_for(wire::cmd::response, 7).first.status == 0);
  // Its bye (on its proven connection) takes worker 1 out of the group: worker 0 goes on alone.
  newer.send(frame_of(wire::cmd::bye, 8));
  CHECK(newer.wait_for(wire::cmd::response, 8).first.status == 0);
  kv.push(5, std::vector<float>(4, 1.f)).wait();
  kv.pull(5, out).wait();
  CHECK(out == std::vector<float>(4, 1.f));
}

TEST_CASE(
    "a server with another KVSTORE_NUM_WORKERS is refused at once, naming both; the job gathers "
    "without it" *
    doctest::timeout(90)) {
  for (int n : {3, 1}) {
    CAPTURE(n);
    auto o = kvtest::test_options(2, 1);
    o.connect_timeout = 20'000ms;  // the refusal, not a deadline, must answer the wrong server
    kvstore::scheduler sched(o);
    o.scheduler_port = sched.port();
    std::thread st([&] { sched.run(); });
    // Two workers register first and wait for their book.
    std::vector<std::promise<std::string>> results(2);
    std::vector<std::thread> workers;
    for (int r = 0; r < 2; ++r)
      workers.emplace_back([&, r] {
        try {
          auto w = o;
          w.role = kvstore::role::worker;
          w.rank_hint = r;
          kvstore::KVStore<kvstore::dist> kv(w);
          kv.init(1, kvtest::filled(4, 0.f));
          kv.push(1, kvtest::filled(4, 1.f)).wait();
          std::vector<float> out(4);
          kv.pull(1, out).wait();
          results[static_cast<std::size_t>(r)].set_value(
              out == kvtest::filled(4, 2.f) ? "ok" : "wrong sum");
        } catch (const kvstore::error& e) {
          results[static_cast<std::size_t>(r)].set_value(e.what());
        }
      });
    std::this_thread::sleep_for(500ms);
    auto bad = o;
    bad.role = kvstore::role::server;
    bad.num_workers = n;
    kvstore::server wrong(bad);
    const std::string want = "server at 127.0.0.1:" + std::to_string(wrong.port());
    const auto t0 = std::chrono::steady_clock::now();
    std::string said;
    try {
      wrong.run();
    } catch (const kvstore::error& e) {
      said = e.what();
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    CAPTURE(said);
    CHECK(said.find(want) != std::string::npos);
    CHECK(said.find("KVSTORE_NUM_WORKERS=" + std::to_string(n) + " but the scheduler has 2") !=
          std::string::npos);
    // The job went on gathering: a server of the right size completes it, and it trains.
    auto good = o;
    good.role = kvstore::role::server;
    kvstore::server right(good);
    std::thread rt([&] { right.run(); });
    for (auto& r : results) {
      auto f = r.get_future();
      REQUIRE(f.wait_for(30s) == std::future_status::ready);
      CHECK(f.get() == "ok");
    }
    for (auto& t : workers) t.join();
    rt.join();
    st.join();
  }
}

TEST_CASE(
    "a worker with another KVSTORE_NUM_SERVERS is refused with both numbers; the deadline names "
    "it" *
    doctest::timeout(60)) {
  auto o = kvtest::test_options(1, 1);
  o.connect_timeout = 3'000ms;  // the scheduler's gathering deadline
  kvstore::scheduler sched(o);
  o.scheduler_port = sched.port();
  std::string serr = "not thrown";
  std::thread st([&] {
    try {
      sched.run();
    } catch (const kvstore::error& e) {
      serr = e.what();
    }
  });
  auto w = o;
  w.num_servers = 2;
  w.connect_timeout = 20'000ms;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    kvstore::KVStore<kvstore::dist> kv(w);
    FAIL("joined a job of another size");
  } catch (const kvstore::error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(e.code() == kvstore::make_error_code(kvstore::errc::invalid_argument));
    CHECK(msg.find("worker at 127.0.0.1:") != std::string::npos);
    CHECK(msg.find("KVSTORE_NUM_SERVERS=2 but the scheduler has 1") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  st.join();  // nobody else came: the scheduler's deadline, naming the refusal
  CAPTURE(serr);
  CHECK(serr.find("the job did not gather within 3000 ms") != std::string::npos);
  CHECK(serr.find("refused: worker at 127.0.0.1:") != std::string::npos);
  CHECK(serr.find("KVSTORE_NUM_SERVERS=2 but the scheduler has 1") != std::string::npos);
}

TEST_CASE("a job that cannot gather tells its waiting workers why" * doctest::timeout(60)) {
  auto o = kvtest::test_options(2, 1);
  o.connect_timeout = 1'500ms;
  kvstore::scheduler sched(o);
  std::string serr = "not thrown";
  std::thread st([&] {
    try {
      sched.run();
    } catch (const kvstore::error& e) {
      serr = e.what();
    }
  });
  auto w = o;
  w.scheduler_port = sched.port();
  w.connect_timeout = 10'000ms;  // its own deadline is later: the scheduler's reason comes first
  const auto t0 = std::chrono::steady_clock::now();
  try {
    kvstore::KVStore<kvstore::dist> kv(w);
    FAIL("joined a job that never gathered");
  } catch (const kvstore::error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(e.code() == kvstore::make_error_code(kvstore::errc::timeout));
    CHECK(msg.find("the job did not gather within 1500 ms") != std::string::npos);
    CHECK(msg.find("0 of 1 servers and 1 of 2 workers registered") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 6s);
  st.join();
  CHECK(serr.find("the job did not gather") != std::string::npos);
}
