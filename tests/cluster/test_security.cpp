// Authentication, limits and hostile clients: a shared token proven by HMAC challenge-response
// before anything else is read; wrong tokens, garbage, oversized frames, slow drips and floods of
// connections are dropped while real workers go on.
#include <kvstore/transport/auth.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/byte_pipe.hpp"
#include "support/cluster.hpp"

#include <kvstore/wire/frame.hpp>  // hand-made frames

#include <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;

namespace {

kvstore::dist_options secured(int w, int s, std::string token) {
  auto o = kvtest::test_options(w, s);
  o.token = std::move(token);
  o.bind_host = "127.0.0.1";  // tests stay on loopback even with a token
  o.handshake_timeout = 1'000ms;
  o.idle_timeout = 2'000ms;
  return o;
}

// A raw TCP client of the server: reads what it is sent until the peer closes or `limit`.
struct raw_client {
  asio::io_context io;
  tcp::socket s{io};
  explicit raw_client(std::uint16_t port) {
    s.connect({asio::ip::make_address("127.0.0.1"), port});
  }
  void write(const std::string& bytes) {
    boost::system::error_code ec;
    asio::write(s, asio::buffer(bytes), ec);
  }
  // True when the peer closed the connection within `limit`.
  bool closed_within(std::chrono::milliseconds limit) {
    s.non_blocking(true);
    auto end = std::chrono::steady_clock::now() + limit;
    char buf[4096];
    while (std::chrono::steady_clock::now() < end) {
      boost::system::error_code ec;
      s.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::would_block) {
        std::this_thread::sleep_for(10ms);
        continue;
      }
      if (ec) return true;  // eof or reset
    }
    return false;
  }
};

std::string header_bytes(kvstore::wire::header h) {
  auto b = kvstore::wire::encode(h);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// Pushes and pulls through the cluster and checks the values: the servers still serve.
void exercise(kvtest::cluster& c, float base) {
  c.run_workers([base](kvstore::KVStore<kvstore::dist>& kv) {
    std::vector<float> v(1000, base), out(1000);
    const std::string name = "w" + std::to_string(static_cast<int>(base));
    kv.init(name, v);
    kv.push(name, v).wait();
    kv.pull(name, out).wait();
    for (float x : out) REQUIRE(x == base * static_cast<float>(kv.num_workers()));
  });
}

}  // namespace

TEST_CASE("proofs: right token checks; wrong token, tampering, other roles or addresses do not" *
          doctest::timeout(10)) {
  namespace tr = kvstore::transport;
  auto n = tr::make_nonce();
  CHECK(n.size() == tr::nonce_size);
  CHECK(n != tr::make_nonce());
  const tr::challenge c{n, kvstore::role::server};
  CHECK(tr::decode_challenge(tr::encode_challenge(c))->nonce == n);
  const auto a = tr::answer_challenge("s3cret", c, kvstore::role::worker, true, "127.0.0.1:4000");
  const auto back = tr::decode_auth(tr::encode_auth(a));
  REQUIRE(back);
  CHECK(back->proof == a.proof);
  auto check = [&](std::string_view token, const tr::challenge& ch, const tr::auth_answer& an,
                   std::string_view addr) {
    return tr::same_proof(tr::connector_proof(token, tr::transcript(ch, an, addr)), a.proof);
  };
  CHECK(check("s3cret", c, a, "127.0.0.1:4000"));
  CHECK_FALSE(check("s3cre", c, a, "127.0.0.1:4000"));
  CHECK_FALSE(check("", c, a, "127.0.0.1:4000"));
  CHECK_FALSE(check("s3cret", c, a, "127.0.0.1:4001"));  // relayed: another source port
  CHECK_FALSE(check("s3cret", tr::challenge{n, kvstore::role::scheduler}, a, "127.0.0.1:4000"));
  auto other = a;
  other.connector = kvstore::role::server;
  CHECK_FALSE(check("s3cret", c, other, "127.0.0.1:4000"));
  auto m = c;
  m.nonce[0] = static_cast<char>(m.nonce[0] ^ 1);
  CHECK_FALSE(check("s3cret", m, a, "127.0.0.1:4000"));
  auto q = a;
  q.proof[5] = static_cast<char>(q.proof[5] ^ 1);
  CHECK_FALSE(tr::same_proof(a.proof, q.proof));
  CHECK_FALSE(tr::same_proof(a.proof, a.proof.substr(1)));
  // The acceptor's proof over the same transcript is not the connector's (no reflection).
  CHECK_FALSE(tr::same_proof(tr::acceptor_proof("s3cret", tr::transcript(c, a, "127.0.0.1:4000")),
                             a.proof));
  CHECK_FALSE(tr::decode_challenge(n));             // too short
  CHECK_FALSE(tr::decode_auth(a.proof + a.proof));  // wrong size
}

TEST_CASE("a job with a token works; a worker with the wrong token is refused" *
          doctest::timeout(60)) {
  kvtest::cluster c(secured(1, 1, "s3cret"));
  // A worker with the wrong token cannot join: a clear error, no hang.
  {
    auto o = c.options();
    o.token = "wrong";
    o.connect_timeout = 3'000ms;
    try {
      kvstore::KVStore<kvstore::dist> kv(o);
      FAIL("joined with a wrong token");
    } catch (const kvstore::error& e) {
      CHECK(std::string(e.what()).find("token") != std::string::npos);
    }
  }
  exercise(c, 3);
}

TEST_CASE("hostile clients are dropped, workers go on" * doctest::timeout(90)) {
  auto o = secured(1, 1, "s3cret");
  kvtest::cluster c(o);
  const auto port = c.server(0).port();

  SUBCASE("garbage before authentication") {
    raw_client g(port);
    g.write(std::string(200, 'x'));
    CHECK(g.closed_within(3'000ms));
  }
  SUBCASE("a data frame without the proof") {
    raw_client g(port);
    kvstore::wire::header h;
    h.command = kvstore::wire::cmd::push;
    h.payload_len = 8;
    g.write(header_bytes(h) + std::string(8, '\0'));
    CHECK(g.closed_within(3'000ms));
  }
  SUBCASE("an oversized length before authentication") {
    raw_client g(port);
    kvstore::wire::header h;
    h.command = kvstore::wire::cmd::auth;
    h.meta_len = 1u << 30;
    g.write(header_bytes(h));
    CHECK(g.closed_within(3'000ms));
  }
  SUBCASE("silence: the handshake deadline drops it") {
    raw_client g(port);
    auto t0 = std::chrono::steady_clock::now();
    CHECK(g.closed_within(5'000ms));
    CHECK(std::chrono::steady_clock::now() - t0 >= 900ms);
  }
  SUBCASE("a slow drip of bytes is cut at the handshake deadline") {
    raw_client g(port);
    auto t0 = std::chrono::steady_clock::now();
    bool closed = false;
    for (int i = 0; i < 60 && !closed; ++i) {
      g.write("K");
      closed = g.closed_within(100ms);
    }
    CHECK(closed);
    CHECK(std::chrono::steady_clock::now() - t0 < 4'000ms);
  }
  SUBCASE("a flood of connections") {
    std::vector<std::unique_ptr<raw_client>> flood;
    for (int i = 0; i < 200; ++i) flood.push_back(std::make_unique<raw_client>(port));
    int closed = 0;
    for (auto& f : flood) closed += f->closed_within(3'000ms);
    CHECK(closed == 200);
  }
  exercise(c, 5);
}

namespace {

// A man in the middle without the token: accepts one connection on its own port and copies bytes
// both ways between it and `target` (a squatted port, a wrong address in a worker's config).
struct relay {
  asio::io_context io;
  tcp::acceptor acc{io, {asio::ip::make_address("127.0.0.1"), 0}};
  std::thread t;
  explicit relay(std::uint16_t target) {
    t = std::thread([this, target] {
      boost::system::error_code ec;
      auto a = std::make_shared<tcp::socket>(io), b = std::make_shared<tcp::socket>(io);
      acc.accept(*a, ec);
      if (ec) return;
      b->connect({asio::ip::make_address("127.0.0.1"), target}, ec);
      if (ec) return;
      kvtest::pipe_bytes(a, b);
      kvtest::pipe_bytes(b, a);
      io.run_for(8s);
    });
  }
  ~relay() {
    io.stop();
    t.join();
  }
  std::uint16_t port() const { return acc.local_endpoint().port(); }
};

// A fake scheduler without the token: it challenges the worker like the real one, takes its
// answer and answers with a proof it had to make up.
struct fake_scheduler {
  asio::io_context io;
  tcp::acceptor acc{io, {asio::ip::make_address("127.0.0.1"), 0}};
  std::thread t;
  std::atomic<bool> got_answer{false};
  fake_scheduler() {
    t = std::thread([this] {
      namespace tr = kvstore::transport;
      boost::system::error_code ec;
      tcp::socket s{io};
      acc.accept(s, ec);
      if (ec) return;
      auto send = [&](kvstore::wire::cmd c, const std::string& meta) {
        kvstore::wire::header h;
        h.command = c;
        h.meta_len = static_cast<std::uint32_t>(meta.size());
        auto b = kvstore::wire::encode(h);
        asio::write(s, asio::buffer(b.data(), b.size()), ec);
        asio::write(s, asio::buffer(meta), ec);
      };
      send(kvstore::wire::cmd::challenge,
           tr::encode_challenge({tr::make_nonce(), kvstore::role::scheduler}));
      kvstore::wire::header_bytes hb;
      asio::read(s, asio::buffer(hb.data(), hb.size()), ec);
      if (ec) return;
      got_answer = true;
      send(kvstore::wire::cmd::auth, std::string(32, 'x'));
      // Holds the connection open: the worker must leave on its own.
      char c;
      s.read_some(asio::buffer(&c, 1), ec);
    });
  }
  ~fake_scheduler() {
    io.stop();
    acc.close();
    t.join();
  }
  std::uint16_t port() const { return acc.local_endpoint().port(); }
};

}  // namespace

TEST_CASE("a worker relayed to the real scheduler by a peer without the token is refused" *
          doctest::timeout(60)) {
  kvtest::cluster c(secured(1, 1, "s3cret"));
  relay r(c.options().scheduler_port);
  auto o = c.options();
  o.scheduler_port = r.port();
  o.connect_timeout = 4'000ms;
  try {
    kvstore::KVStore<kvstore::dist> kv(o);
    FAIL("a relayed worker joined");
  } catch (const kvstore::error& e) {
    INFO(std::string(e.what()));
    // The scheduler sees the relay's address, not the one the worker's proof covers.
    CHECK(std::string(e.what()).find("refused this node's token") != std::string::npos);
  }
  exercise(c, 4);  // the real job is untouched
}

TEST_CASE("a fake scheduler without the token cannot take a worker in" * doctest::timeout(60)) {
  fake_scheduler fake;
  auto o = secured(1, 1, "s3cret");
  o.scheduler_port = fake.port();
  o.connect_timeout = 3'000ms;
  try {
    kvstore::KVStore<kvstore::dist> kv(o);
    FAIL("a worker accepted a fake scheduler");
  } catch (const kvstore::error& e) {
    INFO(std::string(e.what()));
    CHECK(fake.got_answer.load());
    CHECK(std::string(e.what()).find("scheduler") != std::string::npos);
  }
}
