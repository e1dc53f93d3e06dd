// Wire compression without sockets: the element conversions (IEEE half, bfloat16 rounded and
// truncated, from float and from double) against independent references over every 16-bit code
// and the midpoints between codes; 2-bit quantization with error feedback, its packing and its
// malformed payloads; the header rules that follow the encoding; the worker's choice of encoding
// and its frames (client/compression.hpp); the argument checks of set_gradient_compression.
#include <kvstore/wire/encoding.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/helpers.hpp"

#include <kvstore/client/compression.hpp>
#include <kvstore/local.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace wire = kvstore::wire;
using kvstore::compression;
using kvstore::errc;
using kvtest::expect_error;

namespace {

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// IEEE half's value computed from its fields with ldexp, independently of wire::from_fp16.
double half_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

std::vector<std::byte> encode16(wire::encoding e, const std::vector<float>& v) {
  std::vector<std::byte> out(2 * v.size());
  wire::encode_16bit(e, v.data(), v.size(), out.data());
  return out;
}

// Codes one at a time into a 2-bit payload (threshold t), for tests that build payloads by hand.
std::vector<std::byte> two_bit_payload(float t, const std::vector<unsigned>& codes) {
  std::vector<std::byte> p(wire::two_bit_head + (codes.size() + 3) / 4, std::byte{0xFF});
  std::memcpy(p.data(), &t, 4);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    auto& b = p[wire::two_bit_head + i / 4];
    b &= std::byte(~(3u << (2 * (i % 4))));
    b |= std::byte(codes[i] << (2 * (i % 4)));
  }
  return p;
}

}  // namespace

TEST_CASE("the issue's exact values: 0.1 and 70000 in bf16_trunc, bf16 and fp16") {
  CHECK(wire::from_bf16(wire::to_bf16_trunc(0.1f)) == 0.099609375f);
  CHECK(wire::from_bf16(wire::to_bf16(0.1f)) == 0.10009765625f);
  CHECK(wire::from_bf16(wire::to_bf16_trunc(70000.0f)) == 69632.0f);
  CHECK(wire::from_bf16(wire::to_bf16(70000.0f)) == 70144.0f);
  CHECK(wire::from_fp16(wire::to_fp16(0.1f)) == 0.0999755859375f);
  CHECK(wire::to_fp16(70000.0f) == 0x7C00);  // past 65504: Inf
  // From double, the same results.
  CHECK(wire::to_bf16_trunc(0.1) == wire::to_bf16_trunc(0.1f));
  CHECK(wire::to_bf16(0.1) == wire::to_bf16(0.1f));
  CHECK(wire::to_fp16(0.1) == wire::to_fp16(0.1f));
}

TEST_CASE("fp16: every code decodes to its IEEE value and encodes back; midpoints go to even") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    CAPTURE(h);
    const auto code = static_cast<std::uint16_t>(h);
    const float f = wire::from_fp16(code);
    const double want = half_value(code);
    if (std::isnan(want)) {
      CHECK(std::isnan(f));
      CHECK(std::signbit(f) == bool(h & 0x8000));
      const std::uint16_t back = wire::to_fp16(f);
      CHECK((back & 0x7C00) == 0x7C00);  // a NaN stays a NaN, quiet, sign and payload kept
      CHECK((back & 0x3FF) == ((h & 0x3FF) | 0x200));
      CHECK((back & 0x8000) == (h & 0x8000));
      continue;
    }
    CHECK(static_cast<double>(f) == want);
    CHECK(wire::to_fp16(f) == code);
    // The midpoint to the next code up in magnitude (exact in float), and its neighbours.
    const auto mag = h & 0x7FFF;
    if (mag >= 0x7C00) continue;
    const std::uint16_t next = static_cast<std::uint16_t>(code + 1);
    const double upper = (mag == 0x7BFF) ? std::copysign(65536.0, want) : half_value(next);
    const float mid = static_cast<float>((want + upper) / 2);
    REQUIRE(static_cast<double>(mid) == (want + upper) / 2);
    const std::uint16_t even = (h & 1) ? next : code;
    CHECK(wire::to_fp16(mid) == even);
    const float below = std::nextafter(mid, static_cast<float>(want));
    const float above = std::nextafter(mid, std::copysign(INFINITY, mid));
    CHECK(wire::to_fp16(below) == code);
    CHECK(wire::to_fp16(above) == next);
  }
}

TEST_CASE("fp16: overflow, infinities, NaN, subnormals and signed zeros as IEEE says") {
  CHECK(wire::to_fp16(65504.0f) == 0x7BFF);
  CHECK(wire::to_fp16(65519.99f) == 0x7BFF);
  CHECK(wire::to_fp16(65520.0f) == 0x7C00);  // the midpoint to 2^16 rounds to even: Inf
  CHECK(wire::to_fp16(1e10f) == 0x7C00);
  CHECK(wire::to_fp16(-1e10f) == 0xFC00);
  CHECK(wire::to_fp16(std::numeric_limits<float>::max()) == 0x7C00);
  CHECK(wire::to_fp16(INFINITY) == 0x7C00);
  CHECK(wire::to_fp16(-INFINITY) == 0xFC00);
  CHECK(std::isinf(wire::from_fp16(0x7C00)));
  // NaN with its payload in the low bits only (which truncation would lose) stays NaN.
  const std::uint16_t n = wire::to_fp16(from_bits(0x7F800001u));
  CHECK((n & 0x7C00) == 0x7C00);
  CHECK((n & 0x3FF) != 0);
  CHECK(std::isnan(wire::from_fp16(wire::to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  // Subnormals: multiples of 2^-24.
  CHECK(wire::to_fp16(0x1p-24f) == 0x0001);
  CHECK(wire::to_fp16(0x1p-25f) == 0x0000);  // half of the smallest: ties to even, 0
  CHECK(wire::to_fp16(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(wire::to_fp16(3 * 0x1p-25f) == 0x0002);  // 1.5 quanta: ties to even, 2
  CHECK(wire::to_fp16(0x3FFp-24f) == 0x03FF);    // the largest subnormal
  CHECK(wire::to_fp16(0x1p-14f) == 0x0400);      // the smallest normal
  CHECK(wire::to_fp16(0x7FFp-25f) == 0x0400);    // largest subnormal + half: rounds up to it
  CHECK(wire::from_fp16(0x0001) == 0x1p-24f);
  CHECK(wire::from_fp16(0x03FF) == 0x3FFp-24f);
  CHECK(wire::to_fp16(1e-30f) == 0x0000);
  CHECK(wire::to_fp16(-1e-30f) == 0x8000);  // the sign survives underflow
  CHECK(wire::to_fp16(-0.0f) == 0x8000);
  CHECK(std::signbit(wire::from_fp16(0x8000)));
  CHECK(wire::to_fp16(0x1p-149f) == 0x0000);  // a float subnormal
}

TEST_CASE("bf16: every code round-trips; midpoints go to even; truncation takes the high bits") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    CAPTURE(b);
    const auto code = static_cast<std::uint16_t>(b);
    const float f = wire::from_bf16(code);
    CHECK(bits(f) == b << 16);
    if (std::isnan(f)) {
      CHECK(std::isnan(wire::from_bf16(wire::to_bf16(f))));
      CHECK(std::isnan(wire::from_bf16(wire::to_bf16_trunc(f))));
      continue;
    }
    CHECK(wire::to_bf16(f) == code);
    CHECK(wire::to_bf16_trunc(f) == code);
    if ((b & 0x7FFF) >= 0x7F80) continue;
    // Every float between this code and the next: truncation keeps the code; rounding takes
    // the nearer, the even one at the midpoint.
    const std::uint32_t lo = b << 16;
    for (std::uint32_t low : {0x0001u, 0x4000u, 0x7FFFu, 0x8000u, 0x8001u, 0xC000u, 0xFFFFu}) {
      CAPTURE(low);
      const float x = from_bits(lo | low);
      CHECK(wire::to_bf16_trunc(x) == code);
      const std::uint16_t up = static_cast<std::uint16_t>(code + 1);
      const std::uint16_t want = low < 0x8000 ? code : low > 0x8000 ? up : (b & 1) ? up : code;
      CHECK(wire::to_bf16(x) == want);
    }
  }
  CHECK(wire::to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds to Inf
  CHECK(wire::to_bf16_trunc(std::numeric_limits<float>::max()) == 0x7F7F);
  CHECK(wire::to_bf16(-std::numeric_limits<float>::max()) == 0xFF80);
  CHECK(wire::to_bf16(INFINITY) == 0x7F80);
  CHECK(wire::to_bf16_trunc(-INFINITY) == 0xFF80);
  // A NaN whose payload is in the low 16 bits: truncation would make it Inf.
  CHECK(std::isnan(wire::from_bf16(wire::to_bf16_trunc(from_bits(0x7F800001u)))));
  CHECK(std::isnan(wire::from_bf16(wire::to_bf16(from_bits(0xFF800001u)))));
  CHECK(wire::to_bf16(0x1p-149f) == 0x0000);  // float subnormals: bf16 has the same exponent
  CHECK(wire::to_bf16(0x1p-133f) == 0x0001);
}

TEST_CASE("from double: one rounding, not two (a float in between must not decide the tie)") {
  // Just above a midpoint by less than a float can hold: the float rounds onto the midpoint,
  // and rounding that to even would go down; the double is above it, so up is right.
  CHECK(wire::to_fp16(1.0 + 0x1p-11 + 0x1p-40) == 0x3C01);
  CHECK(wire::to_fp16(1.0 + 0x1p-11 - 0x1p-40) == 0x3C00);
  CHECK(wire::to_fp16(1.0 + 0x1p-11) == 0x3C00);  // the tie itself: even
  CHECK(wire::to_bf16(1.0 + 0x1p-8 + 0x1p-40) == 0x3F81);
  CHECK(wire::to_bf16(1.0 + 0x1p-8) == 0x3F80);
  // Just below a bf16 code by less than a float can hold: the float rounds up onto the code,
  // truncating that would keep it; truncating the double must not.
  CHECK(wire::to_bf16_trunc(1.0 + 0x1p-7 - 0x1p-40) == 0x3F80);
  CHECK(wire::to_bf16_trunc(-(1.0 + 0x1p-7 - 0x1p-40)) == 0xBF80);
  // Past the float range.
  CHECK(wire::to_fp16(1e300) == 0x7C00);
  CHECK(wire::to_bf16(1e300) == 0x7F80);
  CHECK(wire::to_bf16_trunc(1e300) == 0x7F7F);  // toward zero: the largest finite
  CHECK(wire::to_bf16(-1e300) == 0xFF80);
  CHECK(wire::to_fp16(1e-300) == 0x0000);
  CHECK(wire::to_fp16(-1e-300) == 0x8000);
  CHECK(wire::to_bf16(std::numeric_limits<double>::infinity()) == 0x7F80);
  CHECK(std::isnan(wire::from_fp16(wire::to_fp16(std::numeric_limits<double>::quiet_NaN()))));
  // Random doubles agree with the float path whenever the double is exactly a float.
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const float f = from_bits(rng());
    if (std::isnan(f)) continue;
    CAPTURE(f);
    CHECK(wire::to_fp16(static_cast<double>(f)) == wire::to_fp16(f));
    CHECK(wire::to_bf16(static_cast<double>(f)) == wire::to_bf16(f));
    CHECK(wire::to_bf16_trunc(static_cast<double>(f)) == wire::to_bf16_trunc(f));
  }
}

TEST_CASE("arrays: every length (whole blocks and the rest) converts as the scalar functions") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-70000.0f, 70000.0f);
  for (std::size_t n : {0u, 1u, 3u, 15u, 16u, 17u, 33u, 100u, 1031u}) {
    CAPTURE(n);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    for (auto e : {wire::encoding::fp16, wire::encoding::bf16, wire::encoding::bf16_trunc}) {
      CAPTURE(wire::encoding_name(e));
      const auto bytes = encode16(e, v);
      std::vector<float> back(n, 1.0f), sum(n, 1.0f);
      wire::decode_16bit<false>(e, bytes.data(), n, back.data());
      wire::decode_16bit<true>(e, bytes.data(), n, sum.data());
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t code;
        std::memcpy(&code, bytes.data() + 2 * i, 2);
        const std::uint16_t want = e == wire::encoding::fp16   ? wire::to_fp16(v[i])
                                   : e == wire::encoding::bf16 ? wire::to_bf16(v[i])
                                                               : wire::to_bf16_trunc(v[i]);
        REQUIRE(code == want);
        const float value =
            e == wire::encoding::fp16 ? wire::from_fp16(code) : wire::from_bf16(code);
        REQUIRE(back[i] == value);
        REQUIRE(sum[i] == 1.0f + value);
      }
      // Doubles too.
      std::vector<double> dv(v.begin(), v.end()), dback(n);
      std::vector<std::byte> db(2 * n);
      wire::encode_16bit(e, dv.data(), n, db.data());
      CHECK(db == bytes);
      wire::decode_16bit<false>(e, db.data(), n, dback.data());
      for (std::size_t i = 0; i < n; ++i) REQUIRE(dback[i] == static_cast<double>(back[i]));
    }
  }
}

TEST_CASE(
    "fp16 arrays in hardware (F16C, where the CPU has it) agree with the scalar bit for bit") {
  MESSAGE("F16C: " << (wire::f16c::available() ? "used" : "not available: portable loops"));
  // Every code decoded (NaNs made quiet alike), as a copy and as a sum.
  std::vector<std::uint16_t> codes(0x10000);
  for (std::uint32_t h = 0; h < 0x10000; ++h) codes[h] = static_cast<std::uint16_t>(h);
  std::vector<float> back(codes.size()), sum(codes.size(), 0.5f);
  const auto* raw = reinterpret_cast<const std::byte*>(codes.data());
  wire::decode_16bit<false>(wire::encoding::fp16, raw, codes.size(), back.data());
  wire::decode_16bit<true>(wire::encoding::fp16, raw, codes.size(), sum.data());
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    CAPTURE(h);
    const float want = wire::from_fp16(static_cast<std::uint16_t>(h));
    REQUIRE(bits(back[h]) == bits(want));
    REQUIRE((std::isnan(want) ? std::isnan(sum[h]) : sum[h] == 0.5f + want));
  }
  // Random bit patterns (NaNs, infinities, subnormals included) encoded.
  std::mt19937 rng(11);
  std::vector<float> v(1 << 18);
  for (auto& x : v) x = from_bits(rng());
  v[3] = 65520.0f;
  v[4] = 0x1p-25f;
  const auto e = encode16(wire::encoding::fp16, v);
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint16_t code;
    std::memcpy(&code, e.data() + 2 * i, 2);
    REQUIRE(code == wire::to_fp16(v[i]));
  }
  // The portable loops (taken without F16C) give the same bytes.
  std::vector<std::uint16_t> portable(v.size());
  wire::convert_elements(v.data(), v.size(), portable.data(),
                         [](float x) { return wire::to_fp16(x); });
  CHECK(std::memcmp(portable.data(), e.data(), e.size()) == 0);
  std::vector<float> portable_back(codes.size());
  wire::convert_elements(codes.data(), codes.size(), portable_back.data(),
                         [](std::uint16_t h) { return wire::from_fp16(h); });
  CHECK(std::memcmp(portable_back.data(), back.data(), back.size() * sizeof(float)) == 0);
  // A signaling NaN half decodes to a quiet NaN float, its payload kept.
  CHECK(bits(wire::from_fp16(0x7C01)) == 0x7FC02000u);
}

TEST_CASE("two_bit: pushes of 0.3 then 0.3 with threshold 0.5 send 0 then 0.5, residual 0.1") {
  std::vector<float> residual{0.0f, 0.0f};
  const std::vector<float> g{0.3f, -0.3f};
  std::vector<std::byte> p(wire::two_bit_bytes(2));
  CHECK(p.size() == 5);
  std::vector<float> sent(2);
  wire::encode_two_bit(g.data(), residual.data(), 2, 0.5f, p.data());
  auto v = wire::view_payload<float>(wire::encoding::two_bit, p);
  REQUIRE(v.count == 2);
  v.copy_to(0, 2, sent.data());
  CHECK(sent == std::vector<float>{0.0f, 0.0f});
  CHECK(residual == std::vector<float>{0.3f, -0.3f});
  wire::encode_two_bit(g.data(), residual.data(), 2, 0.5f, p.data());
  v = wire::view_payload<float>(wire::encoding::two_bit, p);
  v.copy_to(0, 2, sent.data());
  CHECK(sent == std::vector<float>{0.5f, -0.5f});
  CHECK(residual[0] == doctest::Approx(0.1f).epsilon(1e-6));
  CHECK(residual[0] == 0.6f - 0.5f);  // exactly float's rounding of each step
  CHECK(residual[1] == -(0.6f - 0.5f));
  // One push sends at most one threshold; the rest carries: 1.7 sends 0.5 and keeps 1.2.
  std::vector<float> r{0.0f};
  const std::vector<float> big{1.7f};
  wire::encode_two_bit(big.data(), r.data(), 1, 0.5f, p.data());
  v = wire::view_payload<float>(wire::encoding::two_bit, std::span(p).first(5));
  v.copy_to(0, 1, sent.data());
  CHECK(sent[0] == 0.5f);
  CHECK(r[0] == 1.7f - 0.5f);
  // Exactly the threshold sends it and leaves 0.
  std::vector<double> rd{0.0};
  const std::vector<double> at{0.25};
  wire::encode_two_bit(at.data(), rd.data(), 1, 0.25f, p.data());
  CHECK(rd[0] == 0.0);
}

TEST_CASE("two_bit: packing of every length, decoding from any element, sizes a sixteenth") {
  std::mt19937 rng(5);
  for (std::size_t n = 1; n <= 70; ++n) {
    CAPTURE(n);
    std::vector<float> g(n), res(n, 0.0f), want(n);
    for (std::size_t i = 0; i < n; ++i) {
      const int c = static_cast<int>(rng() % 3);  // 0, +t, -t
      g[i] = c == 0 ? 0.25f : c == 1 ? 1.0f : -1.0f;
      want[i] = c == 0 ? 0.0f : c == 1 ? 0.75f : -0.75f;
    }
    std::vector<std::byte> p(wire::two_bit_bytes(n));
    wire::encode_two_bit(g.data(), res.data(), n, 0.75f, p.data());
    const auto v = wire::view_payload<float>(wire::encoding::two_bit, p);
    REQUIRE(v.count == n);
    CHECK(v.threshold == 0.75f);
    for (std::size_t first = 0; first < n; first += 3) {
      std::vector<float> got(n - first, 9.0f), added(n - first, 1.0f);
      v.copy_to(first, n - first, got.data());
      v.add_to(first, n - first, added.data());
      for (std::size_t i = 0; i < got.size(); ++i) {
        REQUIRE(got[i] == want[first + i]);
        REQUIRE(added[i] == 1.0f + want[first + i]);
      }
    }
  }
  // 64 MiB of float: a sixteenth and the threshold.
  const std::uint64_t n = (64u << 20) / 4;
  CHECK(wire::encoded_bytes(wire::encoding::two_bit, n, 4) == (64u << 20) / 16 + 4);
  CHECK(wire::encoded_bytes(wire::encoding::fp16, n, 4) == (64u << 20) / 2);
  CHECK(wire::encoded_bytes(wire::encoding::bf16, n, 8) == (64u << 20) / 2);
  CHECK(wire::encoded_bytes(wire::encoding::plain, n, 4) == 64u << 20);
  CHECK(wire::encoded_bytes(wire::encoding::two_bit, 0, 4) == 0);
}

TEST_CASE("two_bit: malformed payloads are protocol errors naming what is wrong") {
  auto view = [](const std::vector<std::byte>& p) {
    return wire::view_payload<float>(wire::encoding::two_bit, p);
  };
  CHECK(view({}).count == 0);
  CHECK(view(two_bit_payload(0.5f, {1, 2, 0, 1, 2})).count == 5);
  CHECK(view(two_bit_payload(0.5f, {1, 2, 0, 1})).count == 4);
  expect_error([&] { view(std::vector<std::byte>(3)); }, errc::protocol, {"two_bit", "3 bytes"});
  expect_error([&] { view(two_bit_payload(0.5f, {})); }, errc::protocol, {"no codes"});
  expect_error(
      [&] {
        view(two_bit_payload(0.5f, {1, 3, 0, 0, 1}));
      },
      errc::protocol, {"padding (code 3) before its last byte"});
  expect_error(
      [&] {
        view(two_bit_payload(0.5f, {1, 3, 0}));
      },
      errc::protocol, {"padding (code 3) between elements"});
  auto all_padding = two_bit_payload(0.5f, {1, 1, 1, 1});
  all_padding.push_back(std::byte{0xFF});
  expect_error([&] { view(all_padding); }, errc::protocol, {"last byte of padding only"});
  for (float t : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
    CAPTURE(t);
    expect_error([&] { view(two_bit_payload(t, {1})); }, errc::protocol, {"threshold"});
  }
  // 16-bit payloads: whole elements of 2 bytes.
  const std::vector<std::byte> odd(5);
  expect_error([&] { wire::view_payload<float>(wire::encoding::fp16, odd); }, errc::protocol,
               {"fp16 payload of 5 bytes", "2-byte"});
  CHECK(wire::view_payload<float>(wire::encoding::bf16, std::span(odd).first(4)).count == 2);
  expect_error([&] { wire::view_payload<float>(static_cast<wire::encoding>(9), odd); },
               errc::protocol, {"does not know"});
}

TEST_CASE("frame headers: a payload's size follows its encoding; other commands ignore it") {
  wire::header h;
  h.command = wire::cmd::push;
  h.type = wire::dtype::f32;
  h.flags = wire::flag_last | wire::encoding_flags(wire::encoding::fp16);
  auto decodes = [](const wire::header& x) {
    wire::header back;
    std::string why;
    const bool ok = wire::decode(wire::encode(x).data(), back, wire::limits{}, why);
    if (ok) CHECK(back.flags == x.flags);
    return ok;
  };
  h.payload_len = 6;  // 3 halves: not whole floats, whole halves
  CHECK(decodes(h));
  h.payload_len = 5;
  CHECK_FALSE(decodes(h));
  h.flags = wire::encoding_flags(wire::encoding::two_bit);
  h.payload_len = 7;  // any size: the server counts the codes
  CHECK(decodes(h));
  h.flags = 9u << wire::encoding_shift;  // unknown: the server refuses it, knowing the key
  CHECK(decodes(h));
  CHECK(wire::encoding_bits(h.flags) == 9);
  h.command = wire::cmd::data;
  h.flags = wire::encoding_flags(wire::encoding::bf16);
  h.payload_len = 2;
  CHECK(decodes(h));
  h.command = wire::cmd::init;  // no encoding: whole floats
  CHECK_FALSE(decodes(h));
  CHECK(wire::carries_encoding(wire::cmd::pull));
  CHECK_FALSE(wire::carries_encoding(wire::cmd::push_rows));
}

TEST_CASE("the worker's choice: a key's own compression wins, two_bit pulls travel plain") {
  using kvstore::detail::compression_setting;
  compression_setting store;
  kvstore::detail::key_record plain_key(kvstore::key(1), 8, 0, {{0, 0, 8}});
  kvstore::detail::key_record own_key(kvstore::key(2), 8, 0, {{0, 0, 8}},
                                      kvstore::partition::hashed, {compression::bf16_trunc});
  CHECK(store.of(plain_key).type == compression::none);
  store.set({compression::two_bit, 0.25f});
  CHECK(store.of(plain_key).type == compression::two_bit);
  CHECK(store.of(plain_key).threshold == 0.25f);
  CHECK(store.of(own_key).type == compression::bf16_trunc);
  CHECK(kvstore::detail::push_encoding(store.get()) == wire::encoding::two_bit);
  CHECK(kvstore::detail::pull_encoding(store.get()) == wire::encoding::plain);
  CHECK(kvstore::detail::pull_encoding({compression::fp16}) == wire::encoding::fp16);
  // Frames within chunk_bytes of payload.
  CHECK(kvstore::detail::elements_per_frame(wire::encoding::fp16, 40) == 20);
  CHECK(kvstore::detail::elements_per_frame(wire::encoding::two_bit, 40) == 144);
  CHECK(kvstore::detail::elements_per_frame(wire::encoding::two_bit, 2) == 4);
}

TEST_CASE("a compressed push: frames one after the other in one buffer, residual per element") {
  kvstore::detail::key_record m(kvstore::key(1), 10, 0, {{0, 0, 10}});
  kvstore::detail::encoded_push<float> enc(wire::encoding::two_bit, 0.5f);
  enc.add(0, 6);
  enc.add(6, 4);
  REQUIRE(enc.frames().size() == 2);
  CHECK(enc.frames()[1].at == wire::two_bit_bytes(6));
  CHECK(enc.frames()[1].bytes == wire::two_bit_bytes(4));
  const std::vector<float> g(10, 0.3f);
  float* res = kvstore::detail::residual_of<float>(m);
  auto buf = kvstore::detail::push_buffer(m, enc.size());
  CHECK(buf->size() == wire::two_bit_bytes(6) + wire::two_bit_bytes(4));
  enc.encode(g, res, *buf);
  const auto* first = buf->data();
  buf.reset();  // the frames are done with it: the next push reuses it
  buf = kvstore::detail::push_buffer(m, enc.size());
  CHECK(buf->data() == first);
  enc.encode(g, res, *buf);
  {
    auto held = buf;  // a frame still holds it: the next push gets another
    buf.reset();
    CHECK(kvstore::detail::push_buffer(m, enc.size())->data() != held->data());
    buf = held;
  }
  for (const auto& f : enc.frames()) {
    auto v = wire::view_payload<float>(wire::encoding::two_bit,
                                       std::span<const std::byte>(buf->data() + f.at, f.bytes));
    REQUIRE(v.count == f.count);
    std::vector<float> sent(f.count);
    v.copy_to(0, f.count, sent.data());
    CHECK(sent == std::vector<float>(f.count, 0.5f));
  }
  for (int i = 0; i < 10; ++i) CHECK(res[i] == 0.6f - 0.5f);
  kvstore::detail::encoded_push<double> half(wire::encoding::fp16, 0);
  half.add(0, 3);
  const std::vector<double> d{1.0, 0.1, -2.5};
  std::vector<std::byte> hbuf(half.size());
  half.encode(d, nullptr, hbuf);
  const auto* hb = &hbuf;
  REQUIRE(hb->size() == 6);
  std::vector<double> back(3);
  wire::decode_16bit<false>(wire::encoding::fp16, hb->data(), 3, back.data());
  CHECK(back == std::vector<double>{1.0, 0.0999755859375, -2.5});
}

TEST_CASE("bad compression options: a kvstore::error naming the option; local changes nothing" *
          doctest::timeout(10)) {
  kvstore::KVStore<kvstore::local> kv;
  expect_error([&] { kv.set_gradient_compression({static_cast<compression::kind>(7)}); },
               errc::invalid_argument, {"set_gradient_compression", "compression type 7"});
  for (float t : {0.0f, -0.5f, std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
    CAPTURE(t);
    expect_error(
        [&] {
          kv.set_gradient_compression({compression::two_bit, t});
        },
        errc::invalid_argument, {"set_gradient_compression", "two_bit threshold"});
  }
  kv.set_gradient_compression({compression::fp16});
  kv.set_gradient_compression({compression::two_bit, 0.5f});
  kv.set_gradient_compression({compression::fp16, -1.0f});  // the threshold is two_bit's only
  // Local values do not travel: exact whatever the setting.
  const std::vector<float> v{0.1f, 70000.0f};
  kv.init(3, v, kvstore::init_options{.compression = {compression::bf16_trunc}});
  std::vector<float> out(2);
  kv.push(3, v).wait();
  kv.pull(3, out).wait();
  CHECK(out == v);
  expect_error(
      [&] {
        kv.init(4, v, kvstore::init_options{.compression = {compression::two_bit, 0.0f}});
      },
      errc::invalid_argument, {"init of key 4", "two_bit threshold"});
  expect_error([&] { kv.pull(4, out).wait(); }, errc::unknown_key, {"key 4"});  // not inited
}
