// libFuzzer target: the real transport::connection (handshake, pre-auth limits, the buffered
// header -> meta -> payload parser, payload sinks) fed arbitrary bytes over a socketpair.
// First input byte, mode:
//   0  acceptor, the bytes arrive before any authentication (what an intruder can send)
//   1  acceptor, a valid token proof first, then the bytes as frames (an authenticated peer)
//   2  connector: the bytes are what the accepting side sends (challenge, then frames)
// Byte 1 picks the handler's behaviour (payload sinks, refusals). The rest is the stream.
// Invariants: nothing crashes, every run ends with the connection closed (EOF or a refusal), a
// frame reaches the handler only after authentication, and within the limits.
#include "conn_harness.hpp"

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

using namespace kvstore;

struct recorder final : transport::frame_handler {
  explicit recorder(std::uint8_t how, const wire::limits& lim) : how(how), lim(lim) {}
  std::uint8_t how;
  wire::limits lim;
  std::vector<std::byte> sink;
  int frames = 0;
  bool closed = false;
  transport::connection* conn = nullptr;

  std::span<std::byte> payload_sink(transport::connection& c, const wire::header& h) override {
    if (!c.authenticated()) std::abort();  // the sink is the owner's memory: only after auth
    switch (how % 4) {
      case 1:  // a caller's buffer of exactly the payload's size
        sink.assign(h.payload_len, std::byte{0});
        return sink;
      case 2:  // a wrong-sized buffer: the connection must fall back to its own
        sink.assign(h.payload_len / 2 + 1, std::byte{0});
        return sink;
      case 3:
        if (h.command == wire::cmd::push)
          throw error(errc::size_mismatch, "refused by the fuzz handler");
        return {};
      default:
        return {};
    }
  }
  void on_frame(transport::connection& c, const wire::header& h, std::string meta,
                std::span<const std::byte> payload) override {
    if (!c.authenticated()) std::abort();
    if (meta.size() != h.meta_len || payload.size() != h.payload_len) std::abort();
    if (h.meta_len > lim.max_meta || h.payload_len > lim.max_payload) std::abort();
    volatile std::byte sum{0};
    for (auto b : payload) sum = sum ^ b;  // every payload byte must be readable (ASan checks)
    ++frames;
    if ((how & 4) && h.command == wire::cmd::pull)
      throw error(errc::protocol, "refused by the fuzz handler");
    if ((how & 8) && frames == 1) {
      // Answer, so the write path runs alongside the reads.
      transport::out_frame f;
      f.h.command = wire::cmd::response;
      f.h.req_id = h.req_id;
      f.meta = "ok";
      c.send(std::move(f));
    }
  }
  void on_close(transport::connection&, const std::string&) override {
    if (closed) std::abort();  // once
    closed = true;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2 || size > (256 << 10)) return 0;
  const int mode = data[0] % 3;
  const std::uint8_t how = data[1];
  data += 2;
  size -= 2;

  fuzz::asio::io_context io;
  fuzz::socket_pair sp;
  wire::limits lim;
  lim.max_payload = 1 << 20;
  lim.max_meta = 64 << 10;
  recorder rec(how, lim);
  transport::security sec = fuzz::acceptor_security();
  sec.acceptor = mode != 2;
  if (mode == 2) sec.expect_peer = role::server;  // a connector checks whom it reached
  auto c = std::make_shared<transport::tcp_connection>(sp.take_socket(io), rec, lim, sec, 4096);
  c->start();
  if (mode == 1) {
    const std::string nonce = fuzz::read_challenge(io, sp);
    const std::string a = fuzz::auth_frame(nonce);
    sp.write(a.data(), a.size());
  }
  sp.write(data, size);
  sp.close_writing();
  fuzz::run_until_closed(io, *c);
  if (!rec.closed) std::abort();
  return 0;
}
