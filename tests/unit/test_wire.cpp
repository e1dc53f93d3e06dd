// The wire codec without sockets: the frame header and every control message's encode/decode pair
// round-trip exactly, and each decoder refuses what a broken or hostile peer could send (wrong
// magic, version, command or element type; sizes over the limits; truncation; trailing bytes;
// counts larger than the bytes present; values out of range) with errc::protocol and a reason.
#include <kvstore/wire/messages.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/helpers.hpp"

#include <kvstore/wire/commands.hpp>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace wire = kvstore::wire;
using kvstore::errc;
using kvtest::expect_error;

namespace {

wire::header sample_header() {
  wire::header h;
  h.command = wire::cmd::push_rows;
  h.flags = wire::flag_last | wire::flag_rows;
  h.meta_len = 24;
  h.payload_len = 4096;
  h.key = 0x0123456789abcdefull;
  h.req_id = 0xfedcba9876543210ull;
  h.offset = 77;
  h.total = 1ull << 40;
  h.priority = -12;
  h.sender = 9;
  h.type = wire::dtype::f64;
  h.status = 5;
  h.aux = 0xa5a5a5a5a5a5a5a5ull;
  return h;
}

// Every field of a header, to compare two at once.
auto fields(const wire::header& h) {
  return std::tuple(h.command, h.flags, h.meta_len, h.payload_len, h.key, h.req_id, h.offset,
                    h.total, h.priority, h.sender, h.type, h.status, h.aux);
}

// Decodes `b` and expects a refusal whose reason contains `why_part`.
void expect_refused(const wire::header_bytes& b, const std::string& why_part,
                    const wire::limits& lim = {}) {
  wire::header h;
  std::string why;
  CHECK_FALSE(wire::decode(b.data(), h, lim, why));
  CHECK_MESSAGE(why.find(why_part) != std::string::npos, why);
}

void put32(wire::header_bytes& b, std::size_t at, std::uint32_t v) {
  wire::detail::put32(b.data() + at, v);
}
void put16(wire::header_bytes& b, std::size_t at, std::uint16_t v) {
  wire::detail::put16(b.data() + at, v);
}

// Every strict prefix of a valid message is refused as truncated, naming the message.
template <class Decode>
void expect_every_prefix_truncated(const std::string& bytes, Decode decode,
                                   const std::string& what) {
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    expect_error([&] { decode(std::string_view(bytes).substr(0, n)); }, errc::protocol, {what});
  }
}

// A message followed by one more byte is refused: a decoder reads the whole message or nothing.
template <class Decode>
void expect_trailing_refused(const std::string& bytes, Decode decode, const std::string& what) {
  expect_error([&] { decode(bytes + 'x'); }, errc::protocol, {what, "1 unexpected trailing bytes"});
}

std::string states_entry(std::uint64_t key, wire::dtype t, std::uint64_t lo, std::uint64_t hi,
                         std::uint64_t total, std::uint64_t step, std::uint32_t nslots,
                         const std::string& raw) {
  return wire::encode_state_head(key, t, lo, hi, total, step, nslots) + raw;
}

}  // namespace

// ---- the frame header -----------------------------------------------------------------------

TEST_CASE("a header round-trips every field, for every command and element type") {
  auto h = sample_header();
  for (auto c = static_cast<std::uint16_t>(wire::cmd::hello);
       c <= static_cast<std::uint16_t>(wire::cmd::last_); ++c) {
    for (auto t : {wire::dtype::none, wire::dtype::f32, wire::dtype::f64}) {
      CAPTURE(c);
      h.command = static_cast<wire::cmd>(c);
      h.type = t;
      const auto b = wire::encode(h);
      REQUIRE(b.size() == wire::header_size);
      wire::header back;
      std::string why;
      REQUIRE_MESSAGE(wire::decode(b.data(), back, wire::limits{}, why), why);
      CHECK(fields(back) == fields(h));
    }
  }
}

TEST_CASE("the header is little-endian at fixed offsets, starting with the magic \"KVK1\"") {
  const auto b = wire::encode(sample_header());
  CHECK(std::memcmp(b.data(), "KVK1", 4) == 0);
  CHECK(wire::detail::get16(b.data() + 4) == wire::version);
  CHECK(wire::detail::get16(b.data() + 6) == static_cast<std::uint16_t>(wire::cmd::push_rows));
  CHECK(wire::detail::get64(b.data() + 24) == 0x0123456789abcdefull);
  CHECK(std::to_integer<unsigned>(b[24]) == 0xef);  // least significant byte first
  CHECK(static_cast<std::int32_t>(wire::detail::get32(b.data() + 56)) == -12);
  CHECK(wire::detail::get64(b.data() + 72) == 0xa5a5a5a5a5a5a5a5ull);
}

TEST_CASE("a header is refused for a bad magic, version, command or element type") {
  const auto good = wire::encode(sample_header());
  auto b = good;
  put32(b, 0, 0x314B564Cu);
  expect_refused(b, "bad magic");
  b = good;
  put16(b, 4, wire::version + 1);
  expect_refused(b, "protocol version 2 (expected 1)");
  b = good;
  put16(b, 6, 0);
  expect_refused(b, "unknown command 0");
  b = good;
  put16(b, 6, static_cast<std::uint16_t>(wire::cmd::last_) + 1);
  expect_refused(b, "unknown command");
  b = good;
  put32(b, 64, static_cast<std::uint32_t>(wire::dtype::f64) + 1);
  expect_refused(b, "unknown element type 3");
}

TEST_CASE("a header is refused before allocation when its sizes exceed the limits") {
  const wire::limits lim{.max_payload = 1 << 20, .max_meta = 1 << 10};
  auto h = sample_header();
  h.type = wire::dtype::f32;

  h.meta_len = 1 << 10;
  h.payload_len = 1 << 20;
  wire::header back;
  std::string why;
  CHECK_MESSAGE(wire::decode(wire::encode(h).data(), back, lim, why),
                why);  // exactly at the limits

  h.meta_len = (1 << 10) + 1;
  expect_refused(wire::encode(h), "metadata of 1025 bytes exceeds the limit of 1024", lim);
  h.meta_len = 0;
  h.payload_len = (1 << 20) + 4;
  expect_refused(wire::encode(h), "payload of 1048580 bytes exceeds the limit of 1048576", lim);
  // The defaults: 1 GiB of payload, 64 MiB of metadata.
  h.payload_len = (std::uint64_t{1} << 30) + 4;
  expect_refused(wire::encode(h), "exceeds the limit");
  h.payload_len = 0;
  h.meta_len = static_cast<std::uint32_t>(wire::max_meta_default + 1);
  expect_refused(wire::encode(h), "exceeds the limit");
}

TEST_CASE("a payload must be a whole number of elements of its type") {
  auto h = sample_header();
  h.meta_len = 0;
  h.type = wire::dtype::f64;
  h.payload_len = 12;
  expect_refused(wire::encode(h), "payload of 12 bytes is not a whole number of elements");
  h.type = wire::dtype::f32;
  wire::header back;
  std::string why;
  CHECK(wire::decode(wire::encode(h).data(), back, wire::limits{}, why));
  h.type = wire::dtype::none;  // untyped bytes (a control payload): any length
  h.payload_len = 13;
  CHECK(wire::decode(wire::encode(h).data(), back, wire::limits{}, why));
}

TEST_CASE("element types and their sizes") {
  CHECK(wire::dtype_size(wire::dtype::f32) == 4);
  CHECK(wire::dtype_size(wire::dtype::f64) == 8);
  CHECK(wire::dtype_size(wire::dtype::none) == 0);
  CHECK(wire::dtype_of<float>() == wire::dtype::f32);
  CHECK(wire::dtype_of<double>() == wire::dtype::f64);
  CHECK(wire::dtype_of<int>() == wire::dtype::none);
}

// ---- registration ---------------------------------------------------------------------------

TEST_CASE("registration round-trips; a negative rank hint means none") {
  const wire::registration m{kvstore::role::server, 3, "10.0.0.7", 65535, 16, 4};
  const auto back = wire::decode_registration(wire::encode_registration(m));
  CHECK(back.r == kvstore::role::server);
  CHECK(back.rank_hint == 3);
  CHECK(back.host == "10.0.0.7");
  CHECK(back.port == 65535);
  CHECK(back.num_workers == 16);
  CHECK(back.num_servers == 4);

  const auto w = wire::decode_registration(
      wire::encode_registration({kvstore::role::worker, -5, "", 0, 1, INT_MAX}));
  CHECK(w.r == kvstore::role::worker);
  CHECK(w.rank_hint == -1);
  CHECK(w.host.empty());
  CHECK(w.port == 0);
  CHECK(w.num_workers == 1);
  CHECK(w.num_servers == INT_MAX);
}

TEST_CASE(
    "registration refuses unknown roles, out-of-range values, bad hosts, truncation, trailing "
    "bytes") {
  auto enc = [](std::uint32_t role, std::int64_t hint, std::string_view host, std::uint32_t port,
                std::uint32_t workers = 2, std::uint32_t servers = 1) {
    wire::meta_writer w;
    w.u32(role).i64(hint).str(host).u32(port).u32(workers).u32(servers);
    return w.take();
  };
  auto dec = [](std::string_view s) { return wire::decode_registration(s); };
  expect_error([&] { dec(enc(static_cast<std::uint32_t>(kvstore::role::scheduler), 0, "h", 1)); },
               errc::protocol, {"registration", "unknown role 2"});
  expect_error([&] { dec(enc(7, 0, "h", 1)); }, errc::protocol, {"registration", "unknown role 7"});
  expect_error([&] { dec(enc(0, std::int64_t{INT_MAX} + 1, "h", 1)); }, errc::protocol,
               {"registration", "rank hint 2147483648 out of range"});
  expect_error([&] { dec(enc(0, 0, "h", 65536)); }, errc::protocol,
               {"registration", "port 65536 out of range"});
  expect_error([&] { dec(enc(0, 0, std::string(wire::max_host_len + 1, 'h'), 1)); }, errc::protocol,
               {"registration", "host name of 256 bytes"});
  expect_error([&] { dec(enc(0, 0, std::string("a\0b", 3), 1)); }, errc::protocol,
               {"registration", "host name with a NUL byte"});
  CHECK(dec(enc(0, 0, std::string(wire::max_host_len, 'h'), 1)).host.size() == wire::max_host_len);
  expect_error([&] { dec(enc(0, 0, "h", 1, std::uint32_t{INT_MAX} + 1)); }, errc::protocol,
               {"registration", "2147483648 workers"});
  expect_error([&] { dec(enc(0, 0, "h", 1, 2, std::uint32_t{INT_MAX} + 1)); }, errc::protocol,
               {"registration", "2147483648 servers"});

  const auto good = wire::encode_registration({kvstore::role::server, 1, "host", 80, 2, 1});
  expect_every_prefix_truncated(good, dec, "registration: truncated");
  expect_trailing_refused(good, dec, "registration");
}

// ---- address book ---------------------------------------------------------------------------

TEST_CASE("the address book round-trips, with no servers or several") {
  wire::address_book b;
  b.num_workers = 4;
  b.servers = {{0, 8, "10.0.0.1", 9000}, {1, 10, "", 9001}, {2, 12, "host-c", 65535}};
  const auto back = wire::decode_address_book(wire::encode_address_book(b));
  CHECK(back.num_workers == 4);
  REQUIRE(back.servers.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(back.servers[i].rank == b.servers[i].rank);
    CHECK(back.servers[i].id == b.servers[i].id);
    CHECK(back.servers[i].host == b.servers[i].host);
    CHECK(back.servers[i].port == b.servers[i].port);
  }
  CHECK(back.job_secret.empty());
  CHECK(back.credential.empty());
  const auto empty = wire::decode_address_book(wire::encode_address_book({7, {}, {}, {}}));
  CHECK(empty.num_workers == 7);
  CHECK(empty.servers.empty());
  // A server's book carries the job secret, a worker's its credential.
  b.job_secret = std::string(wire::identity_bytes, 's');
  const auto to_server = wire::decode_address_book(wire::encode_address_book(b));
  CHECK(to_server.job_secret == b.job_secret);
  CHECK(to_server.credential.empty());
  b.job_secret.clear();
  b.credential = std::string(wire::identity_bytes, '\0');
  const auto to_worker = wire::decode_address_book(wire::encode_address_book(b));
  CHECK(to_worker.credential == b.credential);
  CHECK(to_worker.job_secret.empty());
}

TEST_CASE(
    "the address book refuses counts beyond the bytes present, ranks out of order, bad values") {
  auto dec = [](std::string_view s) { return wire::decode_address_book(s); };
  {  // a billion servers announced in a few bytes: refused before anything is allocated
    wire::meta_writer w;
    w.u32(1).u32(1'000'000'000).u32(0).u32(8).str("h").u32(1);
    expect_error([&] { dec(w.take()); }, errc::protocol, {"address book", "1000000000 servers in"});
  }
  {
    wire::meta_writer w;
    w.u32(1).u32(2).u32(0).u32(8).str("h").u32(1).u32(0).u32(10).str("h").u32(2);
    expect_error([&] { dec(w.take()); }, errc::protocol, {"address book", "entry 1 has rank 0"});
  }
  {
    wire::meta_writer w;
    w.u32(1).u32(1).u32(0).u32(std::uint32_t{INT_MAX} + 1).str("h").u32(1);
    expect_error([&] { dec(w.take()); }, errc::protocol,
                 {"address book", "server id 2147483648 out of range"});
  }
  {
    wire::meta_writer w;
    w.u32(std::uint32_t{INT_MAX} + 1).u32(0);
    expect_error([&] { dec(w.take()); }, errc::protocol, {"address book", "2147483648 workers"});
  }
  {
    wire::meta_writer w;
    w.u32(1).u32(1).u32(0).u32(8).str("h").u32(70000);
    expect_error([&] { dec(w.take()); }, errc::protocol,
                 {"address book", "port 70000 out of range"});
  }
  {
    wire::meta_writer w;
    w.u32(1).u32(1).u32(0).u32(8).str(std::string("\0", 1)).u32(1);
    expect_error([&] { dec(w.take()); }, errc::protocol, {"address book", "NUL byte"});
  }
  {  // a secret or credential of any other length than 32 bytes, or both in one book
    wire::meta_writer w;
    w.u32(1).u32(0).str(std::string(31, 's')).str("");
    expect_error([&] { dec(w.take()); }, errc::protocol,
                 {"address book", "job secret of 31 bytes"});
    wire::meta_writer c;
    c.u32(1).u32(0).str("").str(std::string(33, 'c'));
    expect_error([&] { dec(c.take()); }, errc::protocol,
                 {"address book", "credential of 33 bytes"});
    wire::meta_writer both;
    both.u32(1).u32(0).str(std::string(32, 's')).str(std::string(32, 'c'));
    expect_error([&] { dec(both.take()); }, errc::protocol,
                 {"address book", "both a job secret and a credential"});
  }
  wire::address_book b{2, {{0, 8, "a", 1}, {1, 10, "bb", 2}}, {}, std::string(32, 'c')};
  const auto good = wire::encode_address_book(b);
  expect_every_prefix_truncated(good, dec, "address book");
  expect_trailing_refused(good, dec, "address book");
}

// ---- optimizer states -----------------------------------------------------------------------

TEST_CASE("optimizer states round-trip: entries in order, slots pointing into the message") {
  std::vector<float> m(6), v(6);
  for (int i = 0; i < 6; ++i) {
    m[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i);
    v[static_cast<std::size_t>(i)] = -1.0f * static_cast<float>(i);
  }
  const std::string raw_m(reinterpret_cast<const char*>(m.data()), 24),
      raw_v(reinterpret_cast<const char*>(v.data()), 24);
  const std::string msg = states_entry(11, wire::dtype::f32, 4, 10, 20, 3, 2, raw_m + raw_v) +
                          states_entry(12, wire::dtype::f64, 5, 5, 5, 0, 0, "") +  // an empty slice
                          states_entry(13, wire::dtype::f64, 0, 1, 1, 9, 1, std::string(8, '\x7f'));
  CHECK(wire::encode_state_head(1, wire::dtype::f32, 0, 0, 0, 0, 0).size() ==
        wire::state_head_size);
  const auto es = wire::decode_states(msg);
  REQUIRE(es.size() == 3);
  CHECK(es[0].key == 11);
  CHECK(es[0].type == wire::dtype::f32);
  CHECK(es[0].lo == 4);
  CHECK(es[0].hi == 10);
  CHECK(es[0].total == 20);
  CHECK(es[0].step == 3);
  CHECK(es[0].nslots == 2);
  CHECK(es[0].slot_bytes() == 24);
  CHECK(es[0].slot(0) == raw_m);
  CHECK(es[0].slot(1) == raw_v);
  CHECK(es[0].raw.data() >= msg.data());  // no copy: views into the message
  CHECK(es[1].key == 12);
  CHECK(es[1].nslots == 0);
  CHECK(es[1].raw.empty());
  CHECK(es[2].slot(0) == std::string(8, '\x7f'));
  CHECK(wire::decode_states("").empty());
}

TEST_CASE(
    "optimizer states refuse bad types, disordered ranges, too many slots, slots beyond the "
    "bytes") {
  auto dec = [](std::string_view s) { return wire::decode_states(s); };
  const std::string slot(8, '\0');
  expect_error([&] { dec(states_entry(1, wire::dtype::none, 0, 2, 2, 0, 1, slot)); },
               errc::protocol, {"optimizer states", "unknown element type 0"});
  expect_error([&] { dec(states_entry(1, static_cast<wire::dtype>(3), 0, 2, 2, 0, 1, slot)); },
               errc::protocol, {"optimizer states", "unknown element type 3"});
  expect_error([&] { dec(states_entry(1, wire::dtype::f32, 3, 2, 4, 0, 0, "")); }, errc::protocol,
               {"optimizer states", "key 1: range [3, 2) of 4"});
  expect_error([&] { dec(states_entry(1, wire::dtype::f32, 0, 5, 4, 0, 0, "")); }, errc::protocol,
               {"optimizer states", "range [0, 5) of 4"});
  expect_error(
      [&] { dec(states_entry(1, wire::dtype::f32, 0, 0, 0, 0, wire::max_state_slots + 1, "")); },
      errc::protocol, {"optimizer states", std::to_string(wire::max_state_slots + 1) + " slots"});
  // A huge slice announced with a few bytes: refused by comparing with the bytes present.
  expect_error(
      [&] {
        dec(states_entry(1, wire::dtype::f64, 0, std::uint64_t{1} << 62, std::uint64_t{1} << 62, 0,
                         2, slot));
      },
      errc::protocol, {"optimizer states", "2 slots of 4611686018427387904 elements in 8 bytes"});
  expect_error([&] { dec(states_entry(1, wire::dtype::f32, 0, 2, 2, 0, 1, std::string(7, '\0'))); },
               errc::protocol, {"optimizer states", "in 7 bytes"});
  const auto good = states_entry(5, wire::dtype::f32, 0, 2, 2, 1, 1, slot);
  for (std::size_t n = 1; n < good.size(); ++n) {  // 0 bytes is a valid empty list
    CAPTURE(n);
    expect_error([&] { dec(std::string_view(good).substr(0, n)); }, errc::protocol,
                 {"optimizer states"});
  }
}

// ---- init metadata and set_optimizer --------------------------------------------------------

TEST_CASE("init metadata round-trips and refuses truncation and trailing bytes") {
  const auto back = wire::decode_init_meta(wire::encode_init_meta({12, std::uint64_t{1} << 50}));
  CHECK(back.lo == 12);
  CHECK(back.hi == std::uint64_t{1} << 50);
  const auto good = wire::encode_init_meta({1, 2});
  CHECK(good.size() == 16);
  auto dec = [](std::string_view s) { return wire::decode_init_meta(s); };
  expect_every_prefix_truncated(good, dec, "init metadata: truncated");
  expect_trailing_refused(good, dec, "init metadata");
}

TEST_CASE("set_optimizer carries a registered name and its parameters, never code") {
  const auto back =
      wire::decode_optimizer(wire::encode_optimizer({"sgd", "learning_rate=0.1,momentum=0.9"}));
  CHECK(back.name == "sgd");
  CHECK(back.params == "learning_rate=0.1,momentum=0.9");
  const auto empty = wire::decode_optimizer(wire::encode_optimizer({"", ""}));
  CHECK(empty.name.empty());
  CHECK(empty.params.empty());
  auto dec = [](std::string_view s) { return wire::decode_optimizer(s); };
  CHECK(dec(wire::encode_optimizer({std::string(wire::max_optimizer_name_len, 'n'), ""}))
            .name.size() == wire::max_optimizer_name_len);
  expect_error(
      [&] {
        dec(wire::encode_optimizer({std::string(wire::max_optimizer_name_len + 1, 'n'), ""}));
      },
      errc::protocol, {"set_optimizer", "optimizer name of 4097 bytes"});
  const auto good = wire::encode_optimizer({"adam", "beta1=0.9"});
  expect_every_prefix_truncated(good, dec, "set_optimizer: truncated");
  expect_trailing_refused(good, dec, "set_optimizer");
}

// ---- row ids --------------------------------------------------------------------------------

TEST_CASE("row ids round-trip as little-endian int64; a partial id is refused") {
  const std::vector<std::int64_t> rows{0, 1, -1, 42, INT64_MAX, INT64_MIN};
  const auto s = wire::encode_rows(rows.data(), rows.size());
  CHECK(s.size() == rows.size() * 8);
  CHECK(static_cast<unsigned char>(s[8]) == 1);  // row 1, least significant byte first
  CHECK(wire::decode_rows(s) == rows);
  CHECK(wire::decode_rows(wire::encode_rows(nullptr, 0)).empty());
  expect_error([&] { wire::decode_rows(s.substr(0, 12)); }, errc::protocol,
               {"row list is not a whole number of int64"});
}

TEST_CASE(
    "batched entries: 24 little-endian bytes each, read in place; counts and sums checked "
    "against the header before anything is used") {
  const std::vector<wire::batch_entry> es{{1, 1, 0}, {~std::uint64_t{0}, 4, 7}, {3, 2, 1}};
  std::string meta(es.size() * wire::batch_entry_size, '\0');
  for (std::size_t i = 0; i < es.size(); ++i)
    wire::put_batch_entry(meta.data() + i * wire::batch_entry_size, es[i]);
  CHECK(static_cast<unsigned char>(meta[24]) == 0xff);  // the second key, low byte first
  CHECK(static_cast<unsigned char>(meta[32]) == 4);     // its elements
  const auto back = wire::decode_batch(meta, 3, 7);
  REQUIRE(back.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(back[i].key == es[i].key);
    CHECK(back[i].elements == es[i].elements);
    CHECK(back[i].aux == es[i].aux);
  }
  // A batched request's header says how many entries and elements: both must match.
  expect_error([&] { wire::decode_batch(meta, 1'000'000'000, 7); }, errc::protocol,
               {"batched request", "3 entries", "1000000000"});
  expect_error([&] { wire::decode_batch(meta, 3, 8); }, errc::protocol, {"7 elements"});
  expect_error([&] { wire::decode_batch(meta, 3, 6); }, errc::protocol, {"key 3"});
  expect_error([&] { wire::decode_batch(meta.substr(0, 30), 1, 1); }, errc::protocol,
               {"not a whole number"});
  expect_error([&] { wire::decode_batch("", 0, 0); }, errc::protocol, {"0 entries"});
  // Empty keys, and elements that would wrap the sum.
  std::string bad = meta;
  wire::put_batch_entry(bad.data(), {1, 0, 0});
  expect_error([&] { wire::decode_batch(bad, 3, 6); }, errc::protocol, {"key 1", "0 elements"});
  wire::put_batch_entry(bad.data(), {1, ~std::uint64_t{0}, 0});
  expect_error([&] { wire::decode_batch(bad, 3, ~std::uint64_t{0}); }, errc::protocol,
               {"past the"});
}

// ---- the metadata reader itself ---------------------------------------------------------------

TEST_CASE("the metadata reader never reads past the end") {
  wire::meta_writer w;
  w.u32(7).u64(8).i64(-9).str("ten").raw("xy");
  const auto s = w.take();
  wire::meta_reader r(s);
  CHECK(r.u32() == 7);
  CHECK(r.u64() == 8);
  CHECK(r.i64() == -9);
  CHECK(r.str() == "ten");
  CHECK(r.remaining() == 2);
  CHECK(r.bytes(2) == "xy");
  CHECK(r.done());
  expect_error([&] { r.u32(); }, errc::protocol, {"truncated control message"});
  // A string whose length prefix claims more than is there.
  wire::meta_writer big;
  big.u32(1000).raw("abc");
  const auto b = big.take();
  wire::meta_reader rb(b);
  expect_error([&] { rb.str(); }, errc::protocol, {"truncated control message"});
}

// ---- range metadata (push/pull with flag_range) ---------------------------------------------

TEST_CASE(
    "range metadata round-trips; an empty or wrapping range, truncation and trailing bytes "
    "are refused") {
  const auto back = wire::decode_range(wire::encode_range({7, std::uint64_t{1} << 40}));
  CHECK(back.offset == 7);
  CHECK(back.length == std::uint64_t{1} << 40);
  const auto good = wire::encode_range({3, 4});
  CHECK(good.size() == 16);
  auto dec = [](std::string_view s) { return wire::decode_range(s); };
  expect_every_prefix_truncated(good, dec, "range metadata: truncated");
  expect_trailing_refused(good, dec, "range metadata");
  for (auto bad : {wire::range_meta{5, 0}, wire::range_meta{~std::uint64_t{0}, 1},
                   wire::range_meta{std::uint64_t{1} << 63, std::uint64_t{1} << 63}}) {
    CAPTURE(bad.offset);
    try {
      (void)wire::decode_range(wire::encode_range(bad));
      FAIL("accepted");
    } catch (const kvstore::error& e) {
      CHECK(e.code() == kvstore::make_error_code(kvstore::errc::protocol));
      CHECK(std::string(e.what()).find("range metadata") != std::string::npos);
    }
  }
  // The header constructors: a range push is a push flagged flag_range, a range pull a pull.
  const wire::key_fields k{9, 100, wire::dtype::f64};
  const auto p = wire::push_range_header(k, 40, 3, true, 2);
  CHECK(p.command == wire::cmd::push);
  CHECK(p.flags == (wire::flag_last | wire::flag_range));
  CHECK(p.offset == 40);
  CHECK(p.aux == 3);
  const auto q = wire::pull_range_header(k, 40, 2);
  CHECK(q.command == wire::cmd::pull);
  CHECK(q.flags == wire::flag_range);
  CHECK(q.offset == 40);
}
