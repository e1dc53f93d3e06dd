// How a connection reads frames that arrive in pieces: through a relay that cuts the byte stream
// at odd places (inside headers, meta and payloads) and pauses between pieces, every frame of a
// stream of mixed sizes (empty to 300 KB, around the read buffer's small_rest_bytes, and many
// small ones) arrives whole and in order, into the owner's sink or the connection's own buffer.
#include <kvstore/transport/tcp_connection.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <boost/asio.hpp>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;
namespace transport = kvstore::transport;
namespace wire = kvstore::wire;

namespace {

constexpr std::size_t small_rest = transport::tcp_connection::small_rest_bytes;

// Payload sizes: empty, tiny, on either side of small_rest_bytes, and past the 64 KiB buffer.
const std::vector<std::size_t> sizes = {
    0,     1,     100,   4095,  4096,  small_rest - 1, small_rest, small_rest + 1, small_rest + 100,
    12000, 16384, 65535, 65536, 70000, 300000};

std::byte byte_of(std::size_t frame, std::size_t at) {
  return static_cast<std::byte>((frame * 131 + at * 7 + (at >> 8)) & 0xff);
}
std::string meta_of(std::size_t frame) {
  return std::string((frame * 37) % 300, static_cast<char>('a' + frame % 26));
}

// Pieces of 1 to 9,000 bytes, in turn, so the reader sees frames cut everywhere.
constexpr std::array<std::size_t, 9> odd_pieces = {1, 7, 23, 100, 1000, 3000, 5000, 9000, 31};

// Forwards what it reads from `from` to `to`, written in `pieces` in turn with `pause` after
// each, until either side closes or `stop`.
void relay(tcp::socket& from, tcp::socket& to, std::atomic<bool>& stop,
           std::span<const std::size_t> pieces, std::chrono::microseconds pause) {
  std::vector<char> buf(std::size_t{64} << 10);
  std::size_t turn = 0;
  boost::system::error_code ec;
  while (!stop) {
    const std::size_t n = from.read_some(asio::buffer(buf), ec);
    if (ec) return;
    for (std::size_t at = 0; at < n && !ec;) {
      const std::size_t k = std::min(n - at, pieces[turn++ % pieces.size()]);
      asio::write(to, asio::buffer(buf.data() + at, k), ec);
      at += k;
      if (pause.count()) std::this_thread::sleep_for(pause);
    }
    if (ec) return;
  }
}

struct frame_seen {
  wire::header h;
  std::string meta;
  std::vector<std::byte> payload;
};

// The accepting end: odd frames (aux 1) are read into a sink of its own, even ones into the
// connection's buffer; it keeps a copy of each frame.
class receiver final : public transport::frame_handler {
 public:
  std::span<std::byte> payload_sink(transport::connection&, const wire::header& h) override {
    if (h.aux != 1) return {};
    sink_.assign(h.payload_len, std::byte{0});
    return sink_;
  }
  void on_frame(transport::connection&, const wire::header& h, std::string meta,
                std::span<const std::byte> payload) override {
    if (h.aux == 1 && payload.data() != sink_.data()) wrong_sink_ = true;
    std::lock_guard lk(m_);
    seen_.push_back({h, std::move(meta), {payload.begin(), payload.end()}});
  }
  void on_close(transport::connection&, const std::string& why) override {
    std::lock_guard lk(m_);
    closed_ = why;
  }
  std::size_t count() {
    std::lock_guard lk(m_);
    return seen_.size();
  }
  std::vector<frame_seen> seen() {
    std::lock_guard lk(m_);
    return seen_;
  }
  std::string closed() {
    std::lock_guard lk(m_);
    return closed_;
  }
  std::atomic<bool> wrong_sink_{false};

 private:
  std::vector<std::byte> sink_;  // the io thread's only
  std::mutex m_;
  std::vector<frame_seen> seen_;
  std::string closed_;
};

class sender final : public transport::frame_handler {
 public:
  void on_frame(transport::connection&, const wire::header&, std::string,
                std::span<const std::byte>) override {}
  void on_close(transport::connection&, const std::string&) override {}
};

kvstore::transport_security security_of(bool acceptor) {
  kvstore::transport_security s;
  s.token = "connection-reads";
  s.acceptor = acceptor;
  s.bind_address = false;  // the relay stands between the two ends
  s.handshake_timeout = 5'000ms;
  return s;
}

// Sends `passes` passes over the sizes, then `small_frames` small frames (so that a read ends
// inside a header behind whole frames), each frame with its own meta length and bytes, from
// `from` to `to`; checks that every frame arrives whole and in order. The payloads live until
// the end (a frame's payload is the caller's until written).
void stream_and_check(asio::io_context& io, tcp::socket from, tcp::socket to, std::size_t passes,
                      std::size_t small_frames) {
  receiver rx;
  sender tx;
  auto rconn = std::make_shared<transport::tcp_connection>(std::move(to), rx, wire::limits{},
                                                           security_of(true));
  auto sconn = std::make_shared<transport::tcp_connection>(std::move(from), tx, wire::limits{},
                                                           security_of(false));
  std::thread runner([&] { io.run(); });
  rconn->start();
  sconn->start();

  const std::size_t sized = passes * sizes.size(), frames = sized + small_frames;
  std::vector<std::vector<std::byte>> payloads(frames);
  for (std::size_t i = 0; i < frames; ++i) {
    auto& p = payloads[i];
    p.resize(i < sized ? sizes[i % sizes.size()] : (i * 53) % 400);
    for (std::size_t j = 0; j < p.size(); ++j) p[j] = byte_of(i, j);
    transport::out_frame f;
    f.h.command = wire::cmd::push;
    f.h.req_id = i + 1;
    f.h.aux = (i / sizes.size()) % 2 == 0 ? i % 2 : 1 - i % 2;  // each size both ways
    f.meta = meta_of(i);
    f.payload = p.data();
    f.payload_len = p.size();
    sconn->send(std::move(f));
  }

  for (int i = 0; i < 6000 && rx.count() < frames && rx.closed().empty(); ++i)
    std::this_thread::sleep_for(10ms);
  const auto seen = rx.seen();
  INFO("receiver closed: " << rx.closed());
  REQUIRE(seen.size() == frames);
  CHECK_FALSE(rx.wrong_sink_.load());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < frames; ++i) {
    const auto& s = seen[i];
    CAPTURE(i);
    CHECK(s.h.req_id == i + 1);
    CHECK(s.meta == meta_of(i));
    if (s.payload != payloads[i]) ++wrong;
  }
  CHECK(wrong == 0);
  rconn->close("test over");
  sconn->close("test over");
  io.stop();
  runner.join();
}

}  // namespace

TEST_CASE("frames cut anywhere by the link arrive whole and in order" * doctest::timeout(120)) {
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  tcp::acceptor server_side(io, {asio::ip::make_address("127.0.0.1"), 0});
  tcp::acceptor relay_side(io, {asio::ip::make_address("127.0.0.1"), 0});

  // sender -> relay_side (chopped) -> server_side; the way back is passed on whole.
  tcp::socket to_relay(io), relay_in(io), relay_out(io), at_server(io);
  to_relay.connect(relay_side.local_endpoint());
  relay_side.accept(relay_in);
  relay_out.connect(server_side.local_endpoint());
  server_side.accept(at_server);
  // Each piece its own segment, at once (Nagle would hold the small ones back).
  relay_in.set_option(tcp::no_delay(true));
  relay_out.set_option(tcp::no_delay(true));

  std::atomic<bool> stop{false};
  // The pause is long enough for the reader to take each piece alone (they add up to ~2 MB).
  std::thread forward([&] { relay(relay_in, relay_out, stop, odd_pieces, 500us); });
  constexpr std::array<std::size_t, 1> whole = {std::size_t{64} << 10};
  std::thread backward([&] { relay(relay_out, relay_in, stop, whole, 0us); });

  stream_and_check(io, std::move(to_relay), std::move(at_server), 3, 400);

  // The relay's sockets are shut down (which wakes its blocked reads), and closed only once its
  // threads are gone: a close beside a thread's read would race on the descriptor.
  stop = true;
  boost::system::error_code ec;
  relay_in.shutdown(tcp::socket::shutdown_both, ec);
  relay_out.shutdown(tcp::socket::shutdown_both, ec);
  forward.join();
  backward.join();
  relay_in.close(ec);
  relay_out.close(ec);
}

// Straight from socket to socket, as fast as both ends go: the writer gathers hundreds of frames
// into one sendmsg and meets a full socket (300 KB payloads), the reader takes a payload's rest
// and the frames behind it in one recvmsg. Every frame still arrives whole and in order.
TEST_CASE("frames written and read in bulk arrive whole and in order" * doctest::timeout(120)) {
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  tcp::acceptor server_side(io, {asio::ip::make_address("127.0.0.1"), 0});
  tcp::socket from(io), to(io);
  from.connect(server_side.local_endpoint());
  server_side.accept(to);
  stream_and_check(io, std::move(from), std::move(to), 40, 4000);
}

// The syscalls under a plain connection's writes and payload reads (transport/socket_io.hpp),
// on a real loopback pair: more buffers in one sendmsg than Asio passes, a read scattered over
// two buffers in order, and what each says when the socket is full, empty, closed or reset.
TEST_CASE("socket_io sends many buffers at once and says why it stopped" * doctest::timeout(60)) {
  asio::io_context io;
  tcp::acceptor acc(io, {asio::ip::make_address("127.0.0.1"), 0});
  tcp::socket a(io), b(io);
  a.connect(acc.local_endpoint());
  acc.accept(b);
  const int fa = a.native_handle(), fb = b.native_handle();

  // 300 buffers of 100 bytes: all in one call (asio::async_write passes 16).
  std::vector<std::byte> out(30000);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = byte_of(1, i);
  std::vector<iovec> bufs;
  for (std::size_t i = 0; i < 300; ++i) bufs.push_back({out.data() + 100 * i, 100});
  const auto sent = transport::send_some(fa, bufs);
  CHECK(sent.error == 0);
  CHECK(sent.bytes == out.size());

  // Read back over two buffers at a time, in order, until all arrived.
  std::vector<std::byte> in(out.size());
  std::size_t got = 0;
  for (int tries = 0; got < in.size() && tries < 1000; ++tries) {
    const std::size_t first = std::min<std::size_t>(7000, in.size() - got);
    iovec two[2] = {{in.data() + got, first}, {in.data() + got + first, in.size() - got - first}};
    const auto r = transport::receive_some(fb, two);
    REQUIRE_FALSE(r.eof);
    REQUIRE(r.error == 0);
    if (r.would_block) std::this_thread::sleep_for(1ms);
    got += r.bytes;
  }
  CHECK(got == in.size());
  CHECK(in == out);

  // Nothing to read now: would_block, no bytes.
  iovec one{in.data(), in.size()};
  const auto empty = transport::receive_some(fb, std::span(&one, 1));
  CHECK(empty.would_block);
  CHECK(empty.bytes == 0);

  // consume: whole buffers, empty ones, then the front of a partly sent one.
  std::byte x[15] = {};
  std::vector<iovec> parts = {{x, 5}, {x + 5, 5}, {x + 10, 0}, {x + 10, 5}};
  std::size_t next = 0;
  transport::consume(parts, next, 7);
  CHECK(next == 1);
  CHECK(parts[1].iov_len == 3);
  CHECK(parts[1].iov_base == static_cast<void*>(x + 7));
  transport::consume(parts, next, 3);
  CHECK(next == 3);  // past the empty buffer too
  transport::consume(parts, next, 5);
  CHECK(next == parts.size());

  // A full socket: would_block, reached within a bounded number of 1 MiB sends.
  std::vector<std::byte> big(std::size_t{1} << 20);
  iovec whole{big.data(), big.size()};
  bool full = false;
  for (int i = 0; i < 1000 && !full; ++i) {
    const auto r = transport::send_some(fa, std::span<const iovec>(&whole, 1));
    REQUIRE(r.error == 0);
    full = r.would_block;
  }
  CHECK(full);

  // A peer that shut its end: this end reads eof. A send on an end shut for sending, and then
  // closed by the peer, fails with an errno.
  tcp::socket c(io), d(io);
  c.connect(acc.local_endpoint());
  acc.accept(d);
  c.shutdown(tcp::socket::shutdown_send);
  iovec into{in.data(), in.size()};
  transport::socket_io_result eof;
  for (int i = 0; i < 1000 && !eof.eof; ++i) {
    eof = transport::receive_some(d.native_handle(), std::span(&into, 1));
    if (eof.would_block) std::this_thread::sleep_for(1ms);
  }
  CHECK(eof.eof);
  d.close();
  transport::socket_io_result failed;
  for (int i = 0; i < 1000 && !failed.error; ++i) {
    failed = transport::send_some(c.native_handle(), std::span<const iovec>(&whole, 1));
    if (!failed.error) std::this_thread::sleep_for(1ms);
  }
  CHECK((failed.error == EPIPE || failed.error == ECONNRESET));
}
