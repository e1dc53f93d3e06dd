#include <kvstore/transport/inproc.hpp>  // first: the header is self-contained

#include <kvstore/dist.hpp>
#include <kvstore/serve.hpp>

#include <doctest/doctest.h>

#include "support/cluster.hpp"
#include "support/helpers.hpp"

#include <boost/asio.hpp>

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// The in-process link (transport/inproc.hpp): frames between two owners on their own io
// threads without sockets, the rules a TCP link keeps (limits, pausing, token, role), and a
// whole job of scheduler, servers and workers in one process over it.

namespace {

namespace asio = boost::asio;
namespace transport = kvstore::transport;
namespace wire = kvstore::wire;
using namespace std::chrono_literals;

// Sockets this process holds now (/proc/self/fd entries that are "socket:[...]").
int open_sockets() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  while (auto* e = ::readdir(d)) {
    char target[64] = {};
    const std::string p = std::string("/proc/self/fd/") + e->d_name;
    const auto len = ::readlink(p.c_str(), target, sizeof target - 1);
    if (len > 0 && std::strncmp(target, "socket:", 7) == 0) ++n;
  }
  ::closedir(d);
  return n;
}

// An owner that records what its end delivers; payloads of command `sink_cmd` go to `sink`.
struct recorder : transport::frame_handler {
  std::mutex m;
  std::condition_variable cv;
  std::vector<wire::header> headers;
  std::vector<std::string> metas;
  std::vector<std::vector<std::byte>> payloads;
  std::vector<const std::byte*> where;
  bool authenticated = false;
  std::string closed_why;
  bool closed = false;
  std::vector<std::byte> sink;
  wire::cmd sink_cmd = wire::cmd::pull;
  bool pause_on_first = false;

  std::span<std::byte> payload_sink(transport::connection&, const wire::header& h) override {
    if (h.command == sink_cmd && sink.size() == h.payload_len) return sink;
    return {};
  }
  void on_frame(transport::connection& c, const wire::header& h, std::string meta,
                std::span<const std::byte> payload) override {
    std::lock_guard lk(m);
    headers.push_back(h);
    metas.push_back(std::move(meta));
    payloads.emplace_back(payload.begin(), payload.end());
    where.push_back(payload.data());
    if (pause_on_first && headers.size() == 1) c.pause_reading();
    cv.notify_all();
  }
  void on_authenticated(transport::connection&) override {
    std::lock_guard lk(m);
    authenticated = true;
    cv.notify_all();
  }
  void on_close(transport::connection&, const std::string& why) override {
    std::lock_guard lk(m);
    closed = true;
    closed_why = why;
    cv.notify_all();
  }
  template <class P>
  bool wait_for(P p) {
    std::unique_lock lk(m);
    return cv.wait_for(lk, 5s, p);
  }
  std::size_t frames() {
    std::lock_guard lk(m);
    return headers.size();
  }
};

// Two io threads, a listener on one and a dialer on the other.
struct link_pair {
  asio::io_context io_a, io_b;
  asio::executor_work_guard<asio::io_context::executor_type> wa{io_a.get_executor()},
      wb{io_b.get_executor()};
  std::thread ta{[this] { io_a.run(); }}, tb{[this] { io_b.run(); }};
  recorder dialer, listener;
  std::shared_ptr<transport::connection> a, b;  // a: the dialer's end, b: the listener's
  std::uint16_t port = 0;

  static kvstore::transport_security sec(kvstore::role self, std::string token = "t") {
    kvstore::transport_security s;
    s.token = std::move(token);
    s.self = self;
    return s;
  }

  explicit link_pair(wire::limits listener_limits = {}) {
    std::mutex m;
    port = transport::inproc_network::get().listen(
        0, {{io_b.get_executor(), &listener, sec(kvstore::role::server), listener_limits},
            [this, &m](std::shared_ptr<transport::connection> c) {
              std::lock_guard lk(m);
              b = c;
              c->start();
            },
            this});
    auto s = sec(kvstore::role::worker);
    s.expect_peer = kvstore::role::server;
    a = transport::inproc_network::get().dial(port, {io_a.get_executor(), &dialer, s, {}}, 1s,
                                              "the server");
    a->start();
    std::lock_guard lk(m);
    REQUIRE(b);
  }
  ~link_pair() {
    transport::inproc_network::get().unlisten(port, this);
    wa.reset();
    wb.reset();
    if (a) a->close("test over");
    ta.join();
    tb.join();
  }
};

transport::out_frame frame(wire::cmd c, std::uint64_t req, std::string meta,
                           const std::vector<std::byte>& payload) {
  transport::out_frame f;
  f.h.command = c;
  f.h.req_id = req;
  f.meta = std::move(meta);
  f.payload = payload.data();
  f.payload_len = payload.size();
  return f;
}

std::vector<std::byte> bytes(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 7 + seed) & 0xff);
  return v;
}

}  // namespace

TEST_CASE("inproc: frames arrive in order, whole, both ways; a sink gets its payload" *
          doctest::timeout(30)) {
  link_pair p;
  REQUIRE(p.dialer.wait_for([&] { return p.dialer.authenticated; }));
  REQUIRE(p.listener.wait_for([&] { return p.listener.authenticated; }));
  CHECK(p.a->peer_proven_role() == kvstore::role::server);
  CHECK(p.b->peer_proven_role() == kvstore::role::worker);
  CHECK(p.a->binding() == p.b->binding());
  CHECK(p.a->binding().size() == 2 * transport::nonce_size);

  const auto big = bytes(3 << 20, 1), small = bytes(10, 2);
  for (std::uint64_t i = 0; i < 100; ++i)
    p.a->send(frame(wire::cmd::push, i, "m" + std::to_string(i), i % 10 ? small : big));
  // A fused frame's pieces arrive as one payload.
  auto x = bytes(5, 3), y = bytes(7, 4);
  transport::out_frame fused;
  fused.h.command = wire::cmd::push;
  fused.h.req_id = 100;
  fused.pieces = {std::span<const std::byte>(x), std::span<const std::byte>(y)};
  fused.payload_len = x.size() + y.size();
  p.a->send(std::move(fused));
  REQUIRE(p.listener.wait_for([&] { return p.listener.headers.size() == 101; }));
  for (std::uint64_t i = 0; i < 100; ++i) {
    CHECK(p.listener.headers[i].req_id == i);
    CHECK(p.listener.metas[i] == "m" + std::to_string(i));
    CHECK(p.listener.payloads[i] == (i % 10 ? small : big));
  }
  auto joined = x;
  joined.insert(joined.end(), y.begin(), y.end());
  CHECK(p.listener.payloads[100] == joined);

  // The other way, into the dialer's sink (a pull's answer lands in the caller's buffer).
  p.dialer.sink.resize(small.size());
  p.b->send(frame(wire::cmd::pull, 7, "", small));
  REQUIRE(p.dialer.wait_for([&] { return p.dialer.headers.size() == 1; }));
  CHECK(p.dialer.where[0] == p.dialer.sink.data());
  CHECK(p.dialer.sink == small);
  CHECK(p.a->queued_bytes() == 0);
}

TEST_CASE("inproc: a frame over the receiver's limits closes the link with the reason" *
          doctest::timeout(30)) {
  wire::limits lim;
  lim.max_payload = 1000;
  link_pair p(lim);
  p.a->send(frame(wire::cmd::push, 1, "", bytes(1001, 0)));
  REQUIRE(p.listener.wait_for([&] { return p.listener.closed; }));
  CHECK(p.listener.closed_why.find("bad frame") != std::string::npos);
  CHECK(p.listener.closed_why.find("1001") != std::string::npos);
  REQUIRE(p.dialer.wait_for([&] { return p.dialer.closed; }));
  CHECK(p.dialer.closed_why == "closed by peer");
  CHECK(p.a->link_lost());
  CHECK(p.listener.frames() == 0);
  // A closed link drops what is sent later.
  p.a->send(frame(wire::cmd::push, 2, "", bytes(1, 0)));
  CHECK(p.listener.frames() == 0);
}

TEST_CASE("inproc: a paused reader holds frames until it resumes, in order" *
          doctest::timeout(30)) {
  link_pair p;
  p.listener.pause_on_first = true;
  for (std::uint64_t i = 0; i < 5; ++i) p.a->send(frame(wire::cmd::push, i, "", bytes(4, 0)));
  REQUIRE(p.listener.wait_for([&] { return p.listener.headers.size() == 1; }));
  std::this_thread::sleep_for(50ms);
  CHECK(p.listener.frames() == 1);
  CHECK(p.a->queued_bytes() == 4 * (wire::header_size + 4));  // not delivered yet
  p.b->resume_reading();
  REQUIRE(p.listener.wait_for([&] { return p.listener.headers.size() == 5; }));
  for (std::uint64_t i = 0; i < 5; ++i) CHECK(p.listener.headers[i].req_id == i);
}

TEST_CASE("inproc: a wrong token, a wrong role and an empty port are refused at the dial" *
          doctest::timeout(30)) {
  asio::io_context io;
  recorder dialer, listener;
  auto& net = transport::inproc_network::get();
  const auto port =
      net.listen(0, {{io.get_executor(), &listener, link_pair::sec(kvstore::role::scheduler), {}},
                     [](std::shared_ptr<transport::connection>) { FAIL("a refused dial reached"); },
                     &listener});
  auto s = link_pair::sec(kvstore::role::worker, "other");
  kvtest::expect_error(
      [&] {
        net.dial(port, {io.get_executor(), &dialer, s, {}}, 1s, "x");
      },
      kvstore::errc::auth_failed, {"token"});
  s = link_pair::sec(kvstore::role::worker);
  s.expect_peer = kvstore::role::server;
  kvtest::expect_error(
      [&] {
        net.dial(port, {io.get_executor(), &dialer, s, {}}, 1s, "x");
      },
      kvstore::errc::auth_failed, {"scheduler, not a server"});
  net.unlisten(port, &listener);
  const auto t0 = std::chrono::steady_clock::now();
  kvtest::expect_error(
      [&] {
        net.dial(port, {io.get_executor(), &dialer, link_pair::sec(kvstore::role::worker), {}},
                 100ms, "x");
      },
      kvstore::errc::unreachable, {"inproc:" + std::to_string(port)});
  CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);  // waited for a listener, as TCP retries
  // A port in use is refused to a second listener.
  const auto again = net.listen(0, {{io.get_executor(), &listener, {}, {}}, {}, &listener});
  kvtest::expect_error(
      [&] {
        net.listen(again, {{io.get_executor(), &listener, {}, {}}, {}, &dialer});
      },
      kvstore::errc::unreachable, {"taken"});
  net.unlisten(again, &dialer);  // not its port: left alone
  kvtest::expect_error(
      [&] {
        net.listen(again, {{io.get_executor(), &listener, {}, {}}, {}, &dialer});
      },
      kvstore::errc::unreachable, {"taken"});
  net.unlisten(again, &listener);
}

TEST_CASE("inproc: a 2 x 2 dist_sync job runs in one process without a socket" *
          doctest::timeout(60)) {
  const int sockets_before = open_sockets();
  REQUIRE(sockets_before >= 0);
  auto o = kvtest::test_options(2, 2);
  o.scheduler_host = std::string(transport::inproc_host);
  o.bind_host = std::string(transport::inproc_host);
  o.token = "inproc-job";
  kvtest::cluster c(o);
  std::atomic<int> max_sockets{0};
  c.run_workers([&](kvstore::KVStore<kvstore::dist>& kv) {
    CHECK(kv.num_servers() == 2);
    const float r = static_cast<float>(kv.rank());
    kv.init(1, kvtest::filled(1000, 0.0f));
    kv.init("big", kvtest::filled(300'000, 1.0f));  // sliced over both servers
    kv.barrier();
    for (int round = 1; round <= 3; ++round) {
      kv.push(1, kvtest::filled(1000, r + 1)).wait();
      kv.push("big", kvtest::filled(300'000, 2.0f)).wait();
      std::vector<float> out(1000), big(300'000);
      kv.pull(1, out).wait();
      kv.pull("big", big).wait();
      CHECK(out == kvtest::filled(1000, 3.0f));  // 1 + 2: the round's sum replaces the value
      CHECK(big == kvtest::filled(300'000, 4.0f));
    }
    max_sockets = std::max(max_sockets.load(), open_sockets());
    kv.barrier();
  });
  CHECK(max_sockets.load() == sockets_before);
}

TEST_CASE("inproc: a worker with the wrong token is refused, naming the token" *
          doctest::timeout(60)) {
  auto o = kvtest::test_options(1, 1);
  o.scheduler_host = std::string(transport::inproc_host);
  o.bind_host = std::string(transport::inproc_host);
  o.token = "right";
  o.connect_timeout = 2s;
  kvtest::cluster c(o);
  auto w = c.options();
  w.role = kvstore::role::worker;
  w.token = "wrong";
  kvtest::expect_error([&] { kvstore::KVStore<kvstore::dist> kv(w); }, kvstore::errc::auth_failed,
                       {"token"});
}

TEST_CASE("inproc: undelivered frames go highest priority first, in order within one" *
          doctest::timeout(30)) {
  link_pair p;
  p.listener.pause_on_first = true;
  auto send = [&](std::uint64_t req, std::int32_t prio) {
    auto f = frame(wire::cmd::push, req, "", bytes(4, 0));
    f.h.priority = prio;
    p.a->send(std::move(f));
  };
  send(0, 0);  // delivered, then the reader pauses
  REQUIRE(p.listener.wait_for([&] { return p.listener.headers.size() == 1; }));
  send(1, 0);
  send(2, -5);
  send(3, 9);
  send(4, 0);
  send(5, 9);
  p.b->resume_reading();
  REQUIRE(p.listener.wait_for([&] { return p.listener.headers.size() == 6; }));
  std::vector<std::uint64_t> order;
  for (auto& h : p.listener.headers) order.push_back(h.req_id);
  CHECK(order == std::vector<std::uint64_t>{0, 3, 5, 1, 4, 2});
}
