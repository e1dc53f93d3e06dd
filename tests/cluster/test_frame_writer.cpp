// transport/frame_writer.hpp on a real socket pair, without Asio: the frames a connection's send
// side writes arrive whole and byte for byte, highest priority first, gathered within its caps;
// a caller's direct write goes at once when the writer is idle and hands its rest to the next
// gathered write when the socket is full; closing drops what waits.
#include <kvstore/transport/frame_writer.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using kvstore::transport::frame_writer;
using kvstore::transport::out_frame;
namespace wire = kvstore::wire;

// Both ends of a Unix stream socket pair, closed at the end of the test.
struct socket_pair {
  int w = -1, r = -1;
  socket_pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    w = fds[0];
    r = fds[1];
  }
  ~socket_pair() {
    ::close(w);
    ::close(r);
  }
  socket_pair(const socket_pair&) = delete;
  socket_pair& operator=(const socket_pair&) = delete;

  // Whatever has arrived, without waiting (bounded: at most `most` bytes).
  std::vector<std::byte> drain(std::size_t most = std::size_t{64} << 20) {
    std::vector<std::byte> got;
    std::byte buf[65536];
    while (got.size() < most) {
      const ssize_t n = ::recv(r, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      got.insert(got.end(), buf, buf + n);
    }
    return got;
  }
};

// A frame with `meta` and a payload of `len` bytes, byte i = (seed + i) % 251.
struct test_frame {
  std::int32_t priority;
  std::uint64_t id;
  std::string meta;
  std::vector<std::byte> payload;
  std::uint64_t aux = 0;  // parse(): the header's
};
test_frame make(std::int32_t priority, std::uint64_t id, std::size_t meta_len, std::size_t len) {
  test_frame t{priority, id, std::string(meta_len, static_cast<char>('a' + id % 26)), {}};
  t.payload.resize(len);
  for (std::size_t i = 0; i < len; ++i) t.payload[i] = std::byte((id + i) % 251);
  return t;
}
out_frame out(const test_frame& t) {
  out_frame f;
  f.h.command = wire::cmd::push;
  f.h.priority = t.priority;
  f.h.req_id = t.id;
  f.meta = t.meta;
  f.payload = t.payload.data();
  f.payload_len = t.payload.size();
  return f;
}

// Splits `bytes` into frames, checking each header; returns them in the order they came.
std::vector<test_frame> parse(const std::vector<std::byte>& bytes) {
  std::vector<test_frame> frames;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= wire::header_size);
    wire::header h;
    std::string why;
    REQUIRE_MESSAGE(wire::decode(bytes.data() + at, h, wire::limits{}, why), why);
    at += wire::header_size;
    REQUIRE(bytes.size() - at >= h.meta_len + h.payload_len);
    test_frame t{h.priority,
                 h.req_id,
                 std::string(reinterpret_cast<const char*>(&bytes[at]), h.meta_len),
                 {}};
    at += h.meta_len;
    t.aux = h.aux;
    t.payload.assign(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                     bytes.begin() + static_cast<std::ptrdiff_t>(at + h.payload_len));
    at += h.payload_len;
    frames.push_back(std::move(t));
  }
  return frames;
}

void check_same(const test_frame& got, const test_frame& want) {
  CHECK(got.id == want.id);
  CHECK(got.priority == want.priority);
  CHECK(got.meta == want.meta);
  CHECK(got.payload == want.payload);
}

// Gathers and sends until the writer has nothing left, draining the reader whenever the socket
// is full; returns every byte that arrived. Bounded: fails after `rounds` waits.
std::vector<std::byte> write_all(frame_writer& w, socket_pair& sp, bool& gathered_any,
                                 int rounds = 100000) {
  std::vector<std::byte> got;
  while (w.gather(false)) {
    gathered_any = true;
    for (;;) {
      const auto r = w.send(sp.w);
      REQUIRE(r.error == 0);
      if (r.done) break;
      auto more = sp.drain();
      got.insert(got.end(), more.begin(), more.end());
      REQUIRE(--rounds > 0);
    }
    w.written();
  }
  auto rest = sp.drain();
  got.insert(got.end(), rest.begin(), rest.end());
  return got;
}

}  // namespace

TEST_CASE("frame_writer: queued frames leave highest priority first, whole and byte for byte" *
          doctest::timeout(60)) {
  socket_pair sp;
  frame_writer w(std::size_t{1} << 20);
  std::vector<test_frame> frames;
  for (std::uint64_t i = 0; i < 40; ++i)
    frames.push_back(make(static_cast<std::int32_t>(i % 3), i, i % 5, (i * 977) % 5000));
  // Not yet open (the handshake is not out): queued, no write started.
  for (auto& t : frames) CHECK(w.queue(out(t), -1, false) == frame_writer::queued::done);
  CHECK(w.queued_bytes() > 0);
  REQUIRE(w.begin_writing());
  bool gathered = false;
  const auto got = parse(write_all(w, sp, gathered));
  CHECK(w.queued_bytes() == 0);
  REQUIRE(got.size() == frames.size());
  // Priority 2 first, then 1, then 0; within a priority, in the order queued.
  std::size_t k = 0;
  for (int p = 2; p >= 0; --p)
    for (auto& t : frames)
      if (t.priority == p) check_same(got[k++], t);
  CHECK(!w.gather(false));  // nothing left: writing is over
}

TEST_CASE("frame_writer: one write gathers at most 256 frames and about gather_bytes" *
          doctest::timeout(60)) {
  socket_pair sp;
  {
    frame_writer w(std::size_t{1} << 20);
    std::vector<test_frame> frames;
    for (std::uint64_t i = 0; i < 300; ++i) frames.push_back(make(0, i, 0, 8));
    for (auto& t : frames) w.queue(out(t), -1, true);
    REQUIRE(w.gather(false));
    REQUIRE(w.send(sp.w).done);
    w.written();
    const auto first = parse(sp.drain());
    CHECK(first.size() == frame_writer::max_gathered_frames);
    REQUIRE(w.gather(false));
    REQUIRE(w.send(sp.w).done);
    w.written();
    CHECK(parse(sp.drain()).size() == 300 - frame_writer::max_gathered_frames);
  }
  {
    // 600-byte frames, gather_bytes 1000: a write takes frames while it holds less than that.
    frame_writer w(1000);
    std::vector<test_frame> frames;
    for (std::uint64_t i = 0; i < 5; ++i) frames.push_back(make(0, i, 0, 600 - wire::header_size));
    for (auto& t : frames) w.queue(out(t), -1, true);
    std::vector<std::size_t> per_write;
    while (w.gather(false)) {
      REQUIRE(w.send(sp.w).done);
      w.written();
      per_write.push_back(parse(sp.drain()).size());
    }
    CHECK(per_write == std::vector<std::size_t>{2, 2, 1});
  }
}

TEST_CASE("frame_writer: a direct write goes at once when idle; a full socket's rest goes next" *
          doctest::timeout(60)) {
  socket_pair sp;
  frame_writer w(std::size_t{1} << 20);
  // Idle: written whole from this thread, nothing left queued.
  const auto small = make(0, 1, 3, 4096);
  CHECK(w.queue(out(small), sp.w, true) == frame_writer::queued::done);
  CHECK(w.queued_bytes() == 0);
  auto got = parse(sp.drain());
  REQUIRE(got.size() == 1);
  check_same(got[0], small);

  // 8 MiB cannot fit the socket's buffer: the direct write sends a part, the io thread's
  // write (gather, send) must finish it before the frame queued behind it.
  const auto big = make(0, 2, 0, std::size_t{8} << 20);
  const auto after = make(5, 3, 1, 100);
  CHECK(w.queue(out(big), sp.w, true) == frame_writer::queued::start);
  CHECK(w.queued_bytes() == wire::header_size + big.payload.size());
  // Behind a write in progress: queued, nothing to start, no direct write.
  CHECK(w.queue(out(after), sp.w, true) == frame_writer::queued::done);
  bool gathered = false;
  const auto bytes = write_all(w, sp, gathered);
  CHECK(gathered);
  got = parse(bytes);
  REQUIRE(got.size() == 2);
  check_same(got[0], big);  // its rest first, though `after` has the higher priority
  check_same(got[1], after);
  CHECK(w.queued_bytes() == 0);
}

TEST_CASE("frame_writer: acks extend the ones queued last; closing drops what waits" *
          doctest::timeout(60)) {
  socket_pair sp;
  frame_writer w(std::size_t{1} << 20);
  const auto t = make(0, 7, 0, 1000);
  w.queue(out(t), -1, false);
  CHECK(!w.extend_acks(wire::acks_header(100, 1)));  // behind a push: queued as a frame
  out_frame ack;
  ack.h = wire::acks_header(100, 1);
  w.queue(std::move(ack), -1, false);
  CHECK(w.extend_acks(wire::acks_header(101, 2)));   // continues it: 100..102 in one frame
  CHECK(!w.extend_acks(wire::acks_header(200, 1)));  // does not
  REQUIRE(w.begin_writing());
  bool gathered = false;
  const auto got = parse(write_all(w, sp, gathered));
  REQUIRE(got.size() == 2);
  check_same(got[0], t);
  CHECK(got[1].id == 100);
  CHECK(got[1].aux == 3);  // three acks in one frame

  w.queue(out(t), -1, false);
  w.close();
  CHECK(w.queued_bytes() == 0);
  CHECK(w.extend_acks(wire::acks_header(103, 1)));  // closed: dropped
  CHECK(w.queue(out(t), sp.w, true) == frame_writer::queued::done);
  CHECK(w.queued_bytes() == 0);
  CHECK(!w.begin_writing());
  CHECK(!w.gather(false));
  CHECK(sp.drain().empty());  // nothing was written, not even directly
}
