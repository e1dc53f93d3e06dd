// Writes the seed corpus of every fuzz target from the library's own encoders:
//   fuzz_make_corpus <dir>   (the repository's is fuzz/corpus; regenerate after a format change)
// Small valid inputs plus near-valid ones (truncated, one field off), a few KiB in all. Files are
// named seed-*; crash-* files next to them are reproducers of fixed bugs and are kept.
#include <kvstore/fwd.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/optim/state_file.hpp>
#include <kvstore/transport/auth.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>
#include <kvstore/wire/snapshot.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace kvstore;
namespace fs = std::filesystem;

namespace {

fs::path root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / ("seed-" + name), std::ios::binary) << bytes;
}

std::string frame(wire::header h, const std::string& meta = {}, const std::string& payload = {}) {
  h.meta_len = static_cast<std::uint32_t>(meta.size());
  h.payload_len = payload.size();
  auto b = wire::encode(h);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size()) + meta + payload;
}

std::string floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

wire::header hdr(wire::cmd c, std::uint64_t key = 0, std::uint64_t req = 0) {
  wire::header h;
  h.command = c;
  h.key = key;
  h.req_id = req;
  return h;
}

std::string states_payload() {
  std::string p =
      wire::encode_state_head(3, wire::dtype::f32, 0, 4, 4, 7, 1) + floats({1, 2, 3, 4});
  p += wire::encode_state_head(5, wire::dtype::f64, 2, 3, 6, 1, 2) + std::string(16, '\x01');
  return p;
}

void frames() {
  wire::header h = hdr(wire::cmd::push, 3, 9);
  h.type = wire::dtype::f32;
  h.total = 4;
  h.flags = wire::flag_last;
  h.payload_len = 16;
  auto b = wire::encode(h);
  const std::string ok(reinterpret_cast<const char*>(b.data()), b.size());
  put("frame", "push", ok);
  put("frame", "auth", frame(hdr(wire::cmd::auth), std::string(32, 'p')).substr(0, 80));
  std::string bad = ok;
  bad[4] = 2;  // version
  put("frame", "version", bad);
  bad = ok;
  bad[6] = 99;  // command
  put("frame", "command", bad);
  bad = ok;
  bad[16] = 3;  // payload not whole elements
  put("frame", "partial-element", bad);
  bad = ok;
  bad[23] = 1;  // huge payload
  put("frame", "huge", bad);
  put("frame", "short", ok.substr(0, 40));
  wire::header r = h;
  r.flags = wire::flag_range | wire::flag_last;
  r.offset = 2;
  r.meta_len = 16;
  auto rb = wire::encode(r);
  put("frame", "push-range", std::string(reinterpret_cast<const char*>(rb.data()), rb.size()));
  wire::header v = hdr(wire::cmd::version, 3, 9);
  v.type = wire::dtype::f32;
  v.total = 4;
  put("frame", "version-command", frame(v));
  // Compressed payloads: 3 halves of a float key (not whole floats), 2-bit codes of any size,
  // an encoding nobody knows (sized by the server), and an odd byte count in halves.
  h.flags = wire::flag_last | wire::encoding_flags(wire::encoding::fp16);
  h.payload_len = 6;
  put("frame", "push-fp16", frame(h).substr(0, 80));
  h.flags = wire::flag_last | wire::encoding_flags(wire::encoding::two_bit);
  h.payload_len = 7;
  put("frame", "push-two-bit", frame(h).substr(0, 80));
  h.flags = 11u << wire::encoding_shift;
  put("frame", "push-unknown-encoding", frame(h).substr(0, 80));
  h.command = wire::cmd::data;
  h.flags = wire::flag_last | wire::encoding_flags(wire::encoding::bf16);
  h.payload_len = 5;
  put("frame", "data-bf16-odd", frame(h).substr(0, 80));
}

// Payloads of fuzz_encoding: the first byte is the encoding (bits 0-3), double (bit 4) and where
// reads split (bits 5-7).
std::string halves(wire::encoding e, const std::vector<float>& v) {
  std::string out(2 * v.size(), '\0');
  wire::encode_16bit(e, v.data(), v.size(), reinterpret_cast<std::byte*>(out.data()));
  return out;
}
std::string two_bits(const std::vector<float>& g, float t) {
  std::vector<float> residual(g.size(), 0.0f);
  std::string out(wire::two_bit_bytes(g.size()), '\0');
  wire::encode_two_bit(g.data(), residual.data(), g.size(), t,
                       reinterpret_cast<std::byte*>(out.data()));
  return out;
}
void encodings() {
  auto mode = [](wire::encoding e, bool dbl, unsigned split) {
    return std::string(1, char(static_cast<unsigned>(e) | (dbl ? 16u : 0u) | split << 5));
  };
  const std::vector<float> v{0.1f, -2.5f, 70000.0f, 1e-7f, 0.0f, -0.0f, 65504.0f};
  put("encoding", "fp16", mode(wire::encoding::fp16, false, 3) + halves(wire::encoding::fp16, v));
  put("encoding", "bf16-double",
      mode(wire::encoding::bf16, true, 5) + halves(wire::encoding::bf16, v));
  put("encoding", "bf16-trunc",
      mode(wire::encoding::bf16_trunc, false, 1) + halves(wire::encoding::bf16_trunc, v));
  put("encoding", "fp16-nan-inf",
      mode(wire::encoding::fp16, false, 2) + std::string("\x01\x7c\x00\x7c\x00\xfc", 6));
  put("encoding", "fp16-odd", mode(wire::encoding::fp16, false, 0) + "\x01\x02\x03");
  const std::vector<float> g{0.5f, -0.5f, 0.0f, 0.5f, 0.5f, -0.5f, 0.0f, 0.0f, -0.5f};
  const std::string q = two_bits(g, 0.5f);
  put("encoding", "two-bit", mode(wire::encoding::two_bit, false, 4) + q);
  put("encoding", "two-bit-double", mode(wire::encoding::two_bit, true, 6) + q);
  std::string bad = q;
  bad[4] = char(0xFF);  // padding in the first byte
  put("encoding", "two-bit-padding-first", mode(wire::encoding::two_bit, false, 0) + bad);
  bad = q + char(0xFF);  // a last byte of padding only
  put("encoding", "two-bit-padding-only", mode(wire::encoding::two_bit, false, 0) + bad);
  put("encoding", "two-bit-no-codes", mode(wire::encoding::two_bit, false, 0) + q.substr(0, 4));
  bad = q;
  bad[3] = char(0xFF);  // threshold NaN
  put("encoding", "two-bit-nan-threshold", mode(wire::encoding::two_bit, false, 0) + bad);
  put("encoding", "plain", mode(wire::encoding::plain, false, 7) + floats({1, 2, 3}));
  put("encoding", "unknown", std::string(1, char(9)) + "abcd");
}

void handshake() {
  auto with = [](int mode, int how, const std::string& s) {
    return std::string{char(mode), char(how)} + s;
  };
  // Pre-auth (mode 0): a wrong proof, a frame before the proof, an oversized proof, junk.
  put("handshake", "wrong-proof", with(0, 0, frame(hdr(wire::cmd::auth), std::string(32, 'x'))));
  put("handshake", "hello-first", with(0, 0, frame(hdr(wire::cmd::hello))));
  put("handshake", "long-proof", with(0, 0, frame(hdr(wire::cmd::auth), std::string(40, 'x'))));
  put("handshake", "junk", with(0, 0, "GET / HTTP/1.1\r\n\r\n"));
  // Authenticated (mode 1): frames of every shape, a payload bigger than the read buffer.
  wire::header p = hdr(wire::cmd::push, 3, 1);
  p.type = wire::dtype::f32;
  p.total = 4;
  wire::header d = hdr(wire::cmd::data, 3, 2);
  d.type = wire::dtype::f64;
  std::string s = frame(hdr(wire::cmd::hello)) + frame(p, "", floats({1, 2, 3, 4})) +
                  frame(hdr(wire::cmd::pull, 3, 3), "meta") + frame(d, "", std::string(300, 'd'));
  put("handshake", "frames", with(1, 0, s));
  put("handshake", "frames-sink", with(1, 1 | 8, s));
  put("handshake", "frames-badsink", with(1, 2 | 4, s));
  put("handshake", "frames-refuse", with(1, 3, s));
  put("handshake", "truncated-payload", with(1, 1, s.substr(0, s.size() - 100)));
  // A payload larger than the connection's 64 KiB read buffer, cut short: the rest is read
  // straight into the sink, then the peer closes.
  wire::header big = hdr(wire::cmd::data, 3, 4);
  big.payload_len = 200000;
  auto bb = wire::encode(big);
  put("handshake", "big-payload-cut",
      with(1, 1,
           std::string(reinterpret_cast<const char*>(bb.data()), bb.size()) +
               std::string(100, 'b')));
  // Connector (mode 2): the acceptor's challenge, then its answers.
  std::string c = frame(hdr(wire::cmd::challenge), std::string(32, 'n') + '\x01');  // a server
  wire::header r = hdr(wire::cmd::response);
  r.status = static_cast<std::uint32_t>(errc::auth_failed);
  put("handshake", "connector",
      with(2, 0,
           c + frame(hdr(wire::cmd::response, 0, 1), "ok") + frame(d, "", std::string(64, 'd'))));
  put("handshake", "connector-refused", with(2, 0, c + frame(r)));
  // The acceptor's proof (wrong: the connector's nonce is random), and a scheduler where a
  // server was expected.
  put("handshake", "connector-bad-proof",
      with(2, 0, c + frame(hdr(wire::cmd::auth), std::string(32, 'p'))));
  put("handshake", "connector-scheduler",
      with(2, 0, frame(hdr(wire::cmd::challenge), std::string(32, 'n') + '\x02')));
  put("handshake", "connector-short-nonce",
      with(2, 0, frame(hdr(wire::cmd::challenge), std::string(8, 'n'))));
}

void messages() {
  auto m = [](int which, const std::string& s) { return std::string(1, char(which)) + s; };
  const std::string reg = wire::encode_registration({role::server, 1, "10.0.0.2", 9092, 4, 2});
  put("messages", "registration", m(0, reg));
  put("messages", "registration-truncated", m(0, reg.substr(0, reg.size() - 3)));
  put("messages", "registration-role",
      m(0, wire::encode_registration({role::scheduler, -1, "", 0, 1, 1})));
  std::string huge = reg;
  huge[huge.size() - 5] = char(0x80);  // num_workers 2^31: out of range
  put("messages", "registration-sizes", m(0, huge));
  // A worker's book (its credential), a server's (the job secret), and one with both.
  wire::address_book book{
      2, {{0, 8, "10.0.0.2", 9092}, {1, 10, "", 9093}}, {}, std::string(32, 'c')};
  const std::string b = wire::encode_address_book(book);
  put("messages", "address-book", m(1, b));
  wire::address_book to_server{2, {{0, 8, "10.0.0.2", 9092}}, std::string(32, 's'), {}};
  put("messages", "address-book-secret", m(1, wire::encode_address_book(to_server)));
  to_server.credential = std::string(32, 'c');
  put("messages", "address-book-both", m(1, wire::encode_address_book(to_server)));
  std::string b2 = b;
  b2[4] = char(0xff);  // servers count beyond the bytes
  put("messages", "address-book-count", m(1, b2));
  const std::string st = states_payload();
  put("messages", "states", m(2, st));
  put("messages", "states-truncated", m(2, st.substr(0, st.size() - 1)));
  std::string st2 = st;
  st2[44] = char(0xff);  // nslots
  put("messages", "states-slots", m(2, st2));
  put("messages", "init", m(3, wire::encode_init_meta({2, 4})));
  put("messages", "optimizer",
      m(4, wire::encode_optimizer({"sgd", optim::make_updater<float>(optim::sgd{}).params})));
  const std::int64_t rows[] = {0, 2, -1};
  put("messages", "rows", m(5, wire::encode_rows(rows, 3)));
  put("messages", "reader", m(6, "\x1b" + reg));
  put("messages", "key-options", m(7, wire::encode_key_multipliers({2.0, 0.0})));
  std::string inf = wire::encode_key_multipliers({1.0, 1.0});
  inf[7] = char(0x7f);  // lr_mult's exponent all ones: not finite
  inf[6] = char(0xf0);
  put("messages", "key-options-inf", m(7, inf));
  put("messages", "range", m(8, wire::encode_range({3, 5})));
  put("messages", "range-empty", m(8, wire::encode_range({3, 0})));
  put("messages", "range-wraps", m(8, wire::encode_range({~std::uint64_t{0} - 1, 5})));
  // Batched requests' entries, after the header's key count and elements (u64 each).
  auto batch = [](std::uint64_t keys, std::uint64_t elements, std::vector<wire::batch_entry> es) {
    std::string s(16 + es.size() * wire::batch_entry_size, '\0');
    std::memcpy(s.data(), &keys, 8);
    std::memcpy(s.data() + 8, &elements, 8);
    for (std::size_t i = 0; i < es.size(); ++i)
      wire::put_batch_entry(s.data() + 16 + i * wire::batch_entry_size, es[i]);
    return s;
  };
  put("messages", "batch", m(9, batch(3, 6, {{1, 1, 0}, {7, 4, 2}, {9, 1, 5}})));
  put("messages", "batch-count", m(9, batch(1'000'000'000, 6, {{1, 6, 0}})));
  put("messages", "batch-sum", m(9, batch(2, 5, {{1, 1, 0}, {2, 1, 0}})));
  put("messages", "batch-empty-key", m(9, batch(2, 1, {{1, 1, 0}, {2, 0, 0}})));
  put("messages", "batch-overflow",
      m(9, batch(2, ~std::uint64_t{0}, {{1, ~std::uint64_t{0}, 0}, {2, 1, 0}})));
  put("messages", "batch-partial", m(9, batch(1, 1, {{1, 1, 0}}) + "x"));
}

template <class T>
std::string state_file() {
  std::map<std::uint64_t, optim::key_state<T>> st;
  st[3].st = {5, {{T(1), T(2), T(3)}}};
  st[key::hash("w")] = {"w", {2, {{T(1)}, {T(2)}}}};
  const fs::path tmp = fs::temp_directory_path() / "kvstore_make_corpus_states";
  optim::save_states<T>(tmp, "sgd", st);
  std::ifstream in(tmp, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(tmp);
  return bytes;
}

void state_files() {
  const std::string f = state_file<float>(), d = state_file<double>();
  put("state_file", "float", std::string(1, '\0') + f);
  put("state_file", "double", std::string(1, '\1') + d);
  put("state_file", "float-truncated", std::string(1, '\0') + f.substr(0, f.size() - 5));
  put("state_file", "double-as-float", std::string(1, '\0') + d);
  // Header length: magic 8 + version 4 + 1 + 1 + 2 + name length 4 + "sgd" + length 8 + CRC 4.
  const std::size_t head = 8 + 4 + 4 + 4 + 3 + 8 + 4;
  put("state_file", "float-payload", std::string(1, '\2') + f.substr(head));
  put("state_file", "double-payload", std::string(1, '\3') + d.substr(head));
}

void versions(const wire::header& init, const std::string& meta, const wire::header& rinit,
              const wire::header& prow, wire::header qrow);
void batches();

void server_frames() {
  // Mode 4: dist_sync, one worker, the hello sent by the harness.
  const std::string meta = wire::encode_init_meta({0, 4});
  wire::header init = hdr(wire::cmd::init, 3, 1);
  init.type = wire::dtype::f32;
  init.total = 4;
  init.flags = wire::flag_last | wire::flag_has_data;
  wire::header push = hdr(wire::cmd::push, 3, 2);
  push.type = wire::dtype::f32;
  push.total = 4;
  push.flags = wire::flag_last;
  wire::header pull = hdr(wire::cmd::pull, 3, 3);
  pull.type = wire::dtype::f32;
  pull.total = 4;
  wire::header rinit = hdr(wire::cmd::init, 5, 4);  // a 3 x 2 matrix
  rinit.type = wire::dtype::f64;
  rinit.total = 6;
  rinit.aux = 2;
  rinit.flags = wire::flag_last | wire::flag_has_data;
  wire::header prow = hdr(wire::cmd::push_rows, 5, 5);
  prow.type = wire::dtype::f64;
  prow.total = 6;
  prow.flags = wire::flag_last;
  wire::header qrow = hdr(wire::cmd::pull_rows, 5, 6);
  qrow.type = wire::dtype::f64;
  qrow.total = 6;
  const std::int64_t rows[] = {2, 0};
  const std::string base =
      frame(init, meta, floats({1, 2, 3, 4})) + frame(push, "", floats({1, 1, 1, 1})) + frame(pull);
  put("server", "init-push-pull", std::string(1, '\4') + base);
  put("server", "async",
      std::string(1, '\5') + base + frame(push, "", floats({1, 1, 1, 1})) + frame(pull));
  put("server", "rows",
      std::string(1, '\4') + frame(rinit, wire::encode_init_meta({0, 6}), std::string(48, '\0')) +
          frame(prow, wire::encode_rows(rows, 2), std::string(32, '\1')) +
          frame(qrow, wire::encode_rows(rows, 2)));
  const std::string opt =
      wire::encode_optimizer({"sgd", optim::make_updater<float>(optim::sgd{}).params});
  put("server", "optimizer-states",
      std::string(1, '\5') + frame(init, meta, floats({1, 2, 3, 4})) +
          frame(hdr(wire::cmd::set_optimizer, 0, 7), opt) + frame(push, "", floats({1, 1, 1, 1})) +
          frame(hdr(wire::cmd::save_states, 0, 8)) +
          frame(
              hdr(wire::cmd::load_states, 0, 9), "sgd",
              wire::encode_state_head(3, wire::dtype::f32, 0, 4, 4, 2, 1) + floats({0, 0, 0, 0})));
  // A key's multipliers, then a push they scale.
  wire::header kopt = wire::key_options_header({3, 4, wire::dtype::f32});
  kopt.req_id = 12;
  put("server", "key-options",
      std::string(1, '\5') + frame(init, meta, floats({1, 2, 3, 4})) +
          frame(hdr(wire::cmd::set_optimizer, 0, 7), opt) +
          frame(kopt, wire::encode_key_multipliers({2.0, 0.5})) +
          frame(push, "", floats({1, 1, 1, 1})) + frame(pull));
  put("server", "two-workers",
      std::string(1, '\6') + base + frame(hdr(wire::cmd::leave, 0, 10)) +
          frame(hdr(wire::cmd::bye, 0, 11)));
  put("server", "no-hello", std::string(1, '\0') + base);

  // Compressed pushes and pulls (the encoding bits of their flags), sync and async.
  auto with = [](wire::header h, wire::encoding e, std::uint64_t req) {
    h.flags |= wire::encoding_flags(e);
    h.req_id = req;
    return h;
  };
  const std::vector<float> g{0.1f, -2.5f, 70000.0f, 0.3f};
  const std::string compressed =
      frame(with(push, wire::encoding::fp16, 20), "", halves(wire::encoding::fp16, g)) +
      frame(with(pull, wire::encoding::bf16_trunc, 21)) +
      frame(with(push, wire::encoding::two_bit, 22), "", two_bits({0.5f, -0.5f, 0, 0.5f}, 0.5f)) +
      frame(with(pull, wire::encoding::fp16, 23)) + frame(with(pull, wire::encoding::plain, 24));
  put("server", "compressed",
      std::string(1, '\4') + frame(init, meta, floats({1, 2, 3, 4})) + compressed);
  const std::string opt2 =
      wire::encode_optimizer({"sgd", optim::make_updater<float>(optim::sgd{}).params});
  put("server", "compressed-async",
      std::string(1, '\5') + frame(init, meta, floats({1, 2, 3, 4})) +
          frame(hdr(wire::cmd::set_optimizer, 0, 25), opt2) + compressed);
  // In several frames: elements [0, 3) in 2 bits, then [3, 4) in bf16.
  wire::header part = with(push, wire::encoding::two_bit, 26);
  part.flags &= ~wire::flag_last;
  wire::header rest = with(push, wire::encoding::bf16, 26);
  rest.offset = 3;
  put("server", "compressed-frames",
      std::string(1, '\4') + frame(init, meta, floats({1, 2, 3, 4})) +
          frame(part, "", two_bits({0.5f, 0, -0.5f}, 0.5f)) +
          frame(rest, "", halves(wire::encoding::bf16, {1.5f})) + frame(pull));
  // Refused, one seed each: an unknown encoding or 2 bits asked of a pull (answered with an
  // error, the connection kept: the plain pull after them is served), malformed 2-bit codes, an
  // odd byte count in halves, a push in an unknown encoding with a payload (each closes the
  // connection).
  const std::string inited = std::string(1, '\4') + frame(init, meta, floats({1, 2, 3, 4}));
  put("server", "compressed-pull-refused",
      inited + frame(with(pull, static_cast<wire::encoding>(9), 30)) +
          frame(with(pull, wire::encoding::two_bit, 31)) + frame(pull));
  put("server", "compressed-bad-codes",
      inited +
          frame(with(push, wire::encoding::two_bit, 32), "", std::string("\0\0\0\x3f\xf7", 5)) +
          frame(pull));
  put("server", "compressed-odd-halves",
      inited + frame(with(push, wire::encoding::fp16, 33), "", std::string(3, '\1')) + frame(pull));
  put("server", "compressed-unknown-push",
      inited + frame(with(push, static_cast<wire::encoding>(9), 34), "", "abcd") + frame(pull));
  put("server", "compressed-too-big",
      std::string(1, '\4') + frame(init, meta, floats({1, 2, 3, 4})) +
          frame(with(push, wire::encoding::fp16, 35), "", floats({1, 1, 1, 1})));
  // A range push in 16 bits: ranges travel plain, so it is refused (unsupported).
  wire::header crange = with(push, wire::encoding::fp16, 36);
  crange.flags |= wire::flag_range;
  crange.offset = 1;
  put("server", "compressed-range-refused",
      inited + frame(crange, wire::encode_range({1, 2}), halves(wire::encoding::fp16, {1, 2})) +
          frame(pull));
  // Range frames (push_range / pull_range): a push of [1, 3) in two frames, a pull of [1, 4), and
  // ones that leave the slice or their range.
  wire::header rpush = push;
  rpush.flags = wire::flag_range;
  rpush.offset = 1;
  rpush.aux = 12;
  wire::header rpush_last = rpush;
  rpush_last.offset = 2;
  rpush_last.flags = wire::flag_range | wire::flag_last;
  wire::header rpull = pull;
  rpull.flags = wire::flag_range;
  rpull.offset = 1;
  const std::string ranges = frame(init, meta, floats({1, 2, 3, 4})) +
                             frame(rpush, wire::encode_range({1, 2}), floats({5})) +
                             frame(rpush_last, wire::encode_range({1, 2}), floats({6})) +
                             frame(rpull, wire::encode_range({1, 3}));
  put("server", "range", std::string(1, '\4') + ranges);
  put("server", "range-async",
      std::string(1, '\5') + ranges + frame(rpull, wire::encode_range({0, 4})));
  put("server", "range-outside",
      std::string(1, '\4') + frame(init, meta, floats({1, 2, 3, 4})) +
          frame(rpull, wire::encode_range({2, 5})) +
          frame(rpush_last, wire::encode_range({0, 1}), floats({7})) +
          frame(rpull, wire::encode_range({1, 0})));
  versions(init, meta, rinit, prow, qrow);
  batches();
}

// Batched frames (issue 12): many small keys' inits, pushes and pulls in one frame each, sync
// and async, two workers; and refused ones: a key named twice, a payload that does not match
// the entries, a key never inited, a key sliced here (not whole), a pull too big to answer.
void batches() {
  auto entries = [](std::vector<wire::batch_entry> es) {
    std::string s(es.size() * wire::batch_entry_size, '\0');
    for (std::size_t i = 0; i < es.size(); ++i)
      wire::put_batch_entry(s.data() + i * wire::batch_entry_size, es[i]);
    return s;
  };
  auto bh = [](wire::cmd c, std::uint64_t keys, std::uint64_t elements, std::uint64_t req,
               bool data = false, bool each = false) {
    wire::header h = wire::batch_header(c, wire::dtype::f32, keys, elements, 0, data, each);
    h.req_id = req;
    return h;
  };
  const std::string three = entries({{1, 1, 0}, {2, 2, 0}, {4, 1, 0}});
  const std::string init =
      frame(bh(wire::cmd::batch_init, 3, 4, 50, true), three, floats({1, 2, 3, 4}));
  const std::string pushes =
      frame(bh(wire::cmd::batch_push, 3, 4, 51), entries({{1, 1, 1}, {2, 2, 1}, {4, 1, 1}}),
            floats({1, 1, 1, 1})) +
      frame(bh(wire::cmd::batch_push, 3, 4, 52), entries({{4, 1, 2}, {1, 1, 2}, {2, 2, 2}}),
            floats({2, 2, 2, 2}));
  const std::string pull = frame(bh(wire::cmd::batch_pull, 3, 4, 53), three);
  put("server", "batch", std::string(1, '\4') + init + pushes + pull);
  put("server", "batch-async", std::string(1, '\5') + init + pushes + pull);
  put("server", "batch-two-workers",
      std::string(1, '\6') + init + pushes + frame(hdr(wire::cmd::leave, 0, 54)) + pull);
  // One key pushed alone, then in a batch: the same round rules.
  wire::header one = hdr(wire::cmd::push, 2, 55);
  one.type = wire::dtype::f32;
  one.total = 2;
  one.aux = 1;
  one.flags = wire::flag_last;
  put("server", "batch-and-one",
      std::string(1, '\4') + init + frame(one, "", floats({5, 5})) +
          frame(bh(wire::cmd::batch_push, 2, 2, 56), entries({{1, 1, 1}, {4, 1, 1}}),
                floats({3, 3})) +
          pull);
  put("server", "batch-named-twice",
      std::string(1, '\4') + init +
          frame(bh(wire::cmd::batch_push, 2, 2, 57), entries({{1, 1, 1}, {1, 1, 2}}),
                floats({1, 1})) +
          pull);
  put("server", "batch-init-twice",
      std::string(1, '\4') +
          frame(bh(wire::cmd::batch_init, 2, 2, 58, true), entries({{8, 1, 0}, {8, 1, 0}}),
                floats({1, 2})) +
          pull);
  put("server", "batch-short-payload",
      std::string(1, '\4') + init +
          frame(bh(wire::cmd::batch_push, 3, 4, 59), entries({{1, 1, 1}, {2, 2, 1}, {4, 1, 1}}),
                floats({1, 1})));
  put("server", "batch-unknown-key",
      std::string(1, '\4') + init +
          frame(bh(wire::cmd::batch_push, 2, 2, 60), entries({{1, 1, 1}, {9, 1, 1}}),
                floats({1, 1})) +
          pull);
  // Key 3 inited as a slice [0, 2) of 4: not a whole key, refused in a batch.
  wire::header sliced = hdr(wire::cmd::init, 3, 61);
  sliced.type = wire::dtype::f32;
  sliced.total = 4;
  sliced.flags = wire::flag_last | wire::flag_has_data;
  put("server", "batch-sliced-key",
      std::string(1, '\4') + frame(sliced, wire::encode_init_meta({0, 2}), floats({1, 2})) +
          frame(bh(wire::cmd::batch_pull, 1, 4, 62), entries({{3, 4, 0}})));
  put("server", "batch-pull-huge",
      std::string(1, '\4') + init +
          frame(bh(wire::cmd::batch_pull, 1, std::uint64_t{1} << 40, 63),
                entries({{1, std::uint64_t{1} << 40, 0}})));
  // Fused one-key pushes (flag_each): each key answered on its own (req_id + i), in sync with
  // one and two workers and in async; a refused one (unknown key) answers every key; request
  // ids that would wrap.
  const std::string each = frame(bh(wire::cmd::batch_push, 3, 4, 70, false, true),
                                 entries({{1, 1, 1}, {2, 2, 1}, {4, 1, 1}}), floats({1, 1, 1, 1})) +
                           frame(bh(wire::cmd::batch_push, 3, 4, 73, false, true),
                                 entries({{4, 1, 2}, {1, 1, 2}, {2, 2, 2}}), floats({2, 2, 2, 2}));
  put("server", "batch-each", std::string(1, '\4') + init + each + pull);
  put("server", "batch-each-async", std::string(1, '\5') + init + each + pull);
  put("server", "batch-each-two-workers",
      std::string(1, '\6') + init + each + frame(hdr(wire::cmd::leave, 0, 76)) + pull);
  put("server", "batch-each-unknown-key",
      std::string(1, '\4') + init +
          frame(bh(wire::cmd::batch_push, 2, 2, 77, false, true), entries({{1, 1, 1}, {9, 1, 1}}),
                floats({1, 1})) +
          pull);
  put("server", "batch-each-wrap",
      std::string(1, '\4') + init +
          frame(bh(wire::cmd::batch_push, 2, 2, ~std::uint64_t{0}, false, true),
                entries({{1, 1, 1}, {2, 2, 1}}), floats({1, 1, 1})) +
          pull);
  // Frames big enough to be planned (server/frame_plans.hpp: 32 keys or more), sent three
  // times so the third follows the plan; then one of the same signature with a key's element
  // count changed inside, and an init naming a new key twice, which frees the slice it made.
  constexpr std::uint64_t many = 40;
  auto keys = [&](std::uint64_t seq, std::uint64_t odd_elements) {
    std::vector<wire::batch_entry> es;
    for (std::uint64_t k = 1; k <= many; ++k) es.push_back({k, k == 10 ? odd_elements : 1, seq});
    return es;
  };
  const std::string many_init = frame(bh(wire::cmd::batch_init, many, many, 80, true),
                                      entries(keys(0, 1)), floats(std::vector<float>(many, 1)));
  std::string planned;
  for (std::uint64_t seq = 1; seq <= 3; ++seq)
    planned += frame(bh(wire::cmd::batch_push, many, many, 80 + seq), entries(keys(seq, 1)),
                     floats(std::vector<float>(many, 1))) +
               frame(bh(wire::cmd::batch_pull, many, many, 90 + seq), entries(keys(0, 1)));
  planned += frame(bh(wire::cmd::batch_push, many, many + 1, 84), entries(keys(4, 2)),
                   floats(std::vector<float>(many + 1, 1)));
  planned += frame(bh(wire::cmd::batch_pull, many, many, 94), entries(keys(0, 1)));
  planned += frame(bh(wire::cmd::batch_init, 2, 2, 85, true), entries({{100, 1, 0}, {100, 1, 0}}),
                   floats({1, 1}));  // a protocol error: the connection closes
  put("server", "batch-planned", std::string(1, '\4') + many_init + planned);
  put("server", "batch-planned-async", std::string(1, '\5') + many_init + planned);
}

// Versions and held pulls (issue 13): the version command (of a key and of one never inited),
// pulls and pull_rows waiting for a version (aux) that pushes then reach, one never reached,
// and in dist_async with staleness 0 and two workers a pull held for the other worker.
void versions(const wire::header& init, const std::string& meta, const wire::header& rinit,
              const wire::header& prow, wire::header qrow) {
  wire::header ver = hdr(wire::cmd::version, 3, 20);
  ver.type = wire::dtype::f32;
  ver.total = 4;
  wire::header unknown = ver;
  unknown.key = 8;
  wire::header wait = hdr(wire::cmd::pull, 3, 21);
  wait.type = wire::dtype::f32;
  wait.total = 4;
  wait.aux = 2;
  wire::header never = wait;
  never.req_id = 22;
  never.aux = ~std::uint64_t{0};
  auto push = [](std::uint64_t seq) {
    wire::header p = hdr(wire::cmd::push, 3, 30 + seq);
    p.type = wire::dtype::f32;
    p.total = 4;
    p.aux = seq;
    p.flags = wire::flag_last;
    return p;
  };
  qrow.aux = 1;
  const std::int64_t rows[] = {1};
  const std::string ones = floats({1, 1, 1, 1});
  const std::string body = frame(init, meta, floats({1, 2, 3, 4})) + frame(ver) + frame(unknown) +
                           frame(wait) + frame(never) + frame(push(1), "", ones) +
                           frame(push(2), "", ones) + frame(ver) +
                           frame(rinit, wire::encode_init_meta({0, 6}), std::string(48, '\0')) +
                           frame(qrow, wire::encode_rows(rows, 1)) +
                           frame(prow, wire::encode_rows(rows, 1), std::string(16, '\1'));
  put("server", "versions-async", std::string(1, '\5') + body);
  put("server", "versions-sync", std::string(1, '\4') + body);
  // Two workers, staleness 0: worker 0 pushes, its pull waits for worker 1, then it leaves.
  wire::header pull = hdr(wire::cmd::pull, 3, 40);
  pull.type = wire::dtype::f32;
  pull.total = 4;
  put("server", "staleness",
      std::string(1, '\x0f') + frame(init, meta, floats({1, 2, 3, 4})) + frame(push(1), "", ones) +
          frame(pull) + frame(ver) + frame(hdr(wire::cmd::leave, 0, 41)) + frame(pull));
}

// Server snapshots (fuzz_snapshot: the first byte picks raw bytes (even) or a body wrapped in a
// valid header (odd)). seed-v1-* and seed-v2-* are files of those versions, kept from before the
// next one.
void snapshots() {
  wire::shard_snapshot s;
  s.rank = 1;
  s.optimizer_name = "sgd";
  s.optimizer_params = optim::make_updater<float>(optim::sgd{}).params;
  wire::slice_snapshot x;
  x.key = 7;
  x.total = 8;
  x.lo = 4;
  x.hi = 8;
  x.round = 3;
  x.step = 2;
  x.value = floats({1, 2, 3, 4});
  x.slots.push_back(floats({0, 0, 0, 0}));
  x.applied = {{0, 5}, {1, 4}};
  x.parts = {{1, 5, 2}};  // worker 1's push 5: two frames applied
  x.lr_mult = 2;
  x.wd_mult = 0;
  s.slices.push_back(x);
  const std::string file = wire::encode_snapshot(s);
  const std::size_t head = sizeof wire::snapshot_magic + 4 + 8 + 4;
  put("snapshot", "raw", std::string(1, '\0') + file);
  put("snapshot", "body", std::string(1, '\1') + file.substr(head));
  put("snapshot", "empty", std::string(1, '\0') + wire::encode_snapshot(wire::shard_snapshot{}));
  put("snapshot", "truncated", std::string(1, '\0') + file.substr(0, file.size() - 9));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_corpus <corpus dir>\n");
    return 2;
  }
  root = argv[1];
  frames();
  handshake();
  messages();
  state_files();
  server_frames();
  snapshots();
  encodings();
  std::printf("corpus written under %s\n", root.c_str());
  return 0;
}
