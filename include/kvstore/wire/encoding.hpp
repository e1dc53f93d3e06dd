// Payload encodings of push, pull and data frames (the encoding bits of their flags, frame.hpp):
// float or double <-> IEEE half (fp16) and bfloat16 (bf16 rounded to nearest even, bf16_trunc
// the high 16 bits), and MXNet's 2-bit codes. Pure functions over bytes, no state: the worker's
// residuals and its choice of encoding live in client/compression.hpp, the server's decoding and
// summing in server/shard.hpp. These loops run on every byte sent, so each element's conversion
// is branch-free (selects, no ifs) and the loops vectorize.
//
// Layouts (little-endian, as every payload):
//   fp16, bf16, bf16_trunc  2 bytes per element.
//   two_bit                 the threshold t (a float), then 4 codes per byte, element i in bits
//                           2*(i%4) and up of byte i/4: 0 -> 0, 1 -> +t, 2 -> -t. Code 3 pads the
//                           last byte, so a payload says how many elements it holds; a 3
//                           anywhere else, or a last byte of padding only, is malformed.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/wire/frame.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

// x86-64 converts float <-> half in hardware (F16C: 8 per instruction, about 10 times the
// portable loop) on nearly every CPU since 2012; used when the CPU has it, checked once at run
// time, so a program built for any x86-64 takes it. Define KVSTORE_NO_F16C to leave it out.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(KVSTORE_NO_F16C) && !defined(__CUDA_ARCH__)
#define KVSTORE_WIRE_F16C 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvstore::wire {

static_assert(std::endian::native == std::endian::little,
              "payloads travel in host byte order: little-endian hosts only");

inline const char* encoding_name(encoding e) noexcept {
  switch (e) {
    case encoding::plain:
      return "plain";
    case encoding::fp16:
      return "fp16";
    case encoding::bf16:
      return "bf16";
    case encoding::bf16_trunc:
      return "bf16_trunc";
    case encoding::two_bit:
      return "two_bit";
  }
  return "unknown";
}

inline bool is_16bit(encoding e) noexcept {
  return e == encoding::fp16 || e == encoding::bf16 || e == encoding::bf16_trunc;
}

/// The threshold in front of a 2-bit payload's codes.
inline constexpr std::size_t two_bit_head = 4;

/// Payload bytes of n elements of `elem` bytes in encoding e (0 for no elements).
inline std::uint64_t encoded_bytes(encoding e, std::uint64_t n, std::size_t elem) noexcept {
  if (e == encoding::plain) return n * elem;
  if (e == encoding::two_bit) return n ? two_bit_head + (n + 3) / 4 : 0;
  return n * 2;
}

// ---- one element ---------------------------------------------------------------------------

// Selects by mask rather than by branch: GCC if-converts these where it leaves nested ?: as
// control flow, which stops the loops from vectorizing.
inline std::uint32_t mask(bool c) noexcept { return 0u - static_cast<std::uint32_t>(c); }
inline std::uint32_t pick(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  return (a & mask(c)) | (b & ~mask(c));
}

/// IEEE half, rounded to nearest even: overflow to Inf (from 65520 on), subnormals below 2^-14,
/// NaN stays NaN (quiet, its top payload bits kept).
inline std::uint16_t to_fp16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFFFFFFu;  // |f|
  // Normal halves: rebias the exponent (127 -> 15: subtract 112 << 23) and round away the 13
  // low mantissa bits to nearest even. A carry out of the mantissa moves to the exponent,
  // which is right up to and including Inf (0x7C00).
  const std::uint32_t normal = (a - (112u << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal halves (|f| < 2^-14) are multiples of 2^-24, the spacing of floats in [0.5, 1):
  // adding 0.5 rounds |f| to one (nearest even, by the FPU) and leaves the count in the low
  // bits. A result of 0x400 is the smallest normal half, correctly.
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3F000000u;
  const std::uint32_t special = 0x7C00u | (mask(a > 0x7F800000u) & (0x200u | ((a >> 13) & 0x3FFu)));
  std::uint32_t h = pick(a < (113u << 23), sub, normal);
  h = pick(a >= (143u << 23), special, h);  // |f| >= 2^16, Inf or NaN
  return static_cast<std::uint16_t>(h | sign);
}

inline float from_fp16(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t a = h & 0x7FFFu;
  const std::uint32_t normal = (a << 13) + (112u << 23);
  // A subnormal half is a count of 2^-24: exact as a float, no float subnormal involved (so a
  // flush-to-zero mode cannot change it).
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(a)) * 0x1p-24f);
  // Inf, or NaN with its payload, made quiet (as IEEE's conversion and F16C's do).
  const std::uint32_t special = (a << 13) | 0x7F800000u | (mask(a > 0x7C00u) & 0x00400000u);
  std::uint32_t bits = pick(a < 0x0400u, sub, normal);
  bits = pick(a >= 0x7C00u, special, bits);
  return std::bit_cast<float>(bits | sign);
}

/// bfloat16, rounded to nearest even (overflow to Inf); NaN stays NaN (quiet).
inline std::uint16_t to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>(pick((x & 0x7FFFFFFFu) > 0x7F800000u, nan, rounded));
}

/// bfloat16 by truncation: the high 16 bits of the float (BigDL's "fp16"), except that a NaN
/// whose payload lies in the low bits stays NaN instead of becoming Inf.
inline std::uint16_t to_bf16_trunc(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>(pick((x & 0x7FFFFFFFu) > 0x7F800000u, nan, x >> 16));
}

inline float from_bf16(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// A double goes through a float without rounding twice: rounded to odd (toward zero, then the
// last bit set when inexact), a float keeps enough of the double for one correct rounding to
// 16 bits after it (it has 13 and more bits to spare); toward zero for truncation.
inline float to_float_toward_zero(double d) noexcept {
  const float f = static_cast<float>(d);
  const std::uint32_t b = std::bit_cast<std::uint32_t>(f);
  // One step toward zero when rounding went away from it (Inf becomes the largest float).
  return std::bit_cast<float>(std::fabs(static_cast<double>(f)) > std::fabs(d) ? b - 1 : b);
}
inline float to_float_odd(double d) noexcept {
  const float z = to_float_toward_zero(d);
  const std::uint32_t b = std::bit_cast<std::uint32_t>(z);
  return std::bit_cast<float>(static_cast<double>(z) != d && d == d ? b | 1u : b);
}
inline std::uint16_t to_fp16(double d) noexcept { return to_fp16(to_float_odd(d)); }
inline std::uint16_t to_bf16(double d) noexcept { return to_bf16(to_float_odd(d)); }
inline std::uint16_t to_bf16_trunc(double d) noexcept {
  return to_bf16_trunc(to_float_toward_zero(d));
}

// ---- arrays --------------------------------------------------------------------------------
//
// GCC at -O2 vectorizes a loop only when it needs no run-time checks: its trip count a known
// multiple of the vector width and its pointers known not to alias. So every loop below runs
// over blocks of exactly `block` elements (then the rest), on __restrict pointers that are
// parameters, not lambda captures; they vectorize at -O2 as at -O3, and with clang.
inline constexpr std::size_t block = 16;

/// out[i] = f(in[i]) (Add: out[i] += f(in[i])) for i in [0, n); f is a pure element conversion.
template <bool Add = false, class In, class Out, class F>
inline void convert_elements(const In* __restrict in, std::size_t n, Out* __restrict out, F f) {
  auto run = [f](const In* __restrict a, std::size_t m, Out* __restrict b) {
    for (std::size_t i = 0; i < m; ++i) {
      if constexpr (Add)
        b[i] += f(a[i]);
      else
        b[i] = f(a[i]);
    }
  };
  std::size_t i = 0;
  for (; i + block <= n; i += block) run(in + i, block, out + i);
  run(in + i, n - i, out + i);
}

namespace f16c {
#ifdef KVSTORE_WIRE_F16C
/// Whether this CPU has F16C and the OS saves the AVX registers it uses (checked once).
inline bool available() noexcept {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    if (!(c & bit_F16C) || !(c & bit_AVX) || !(c & bit_OSXSAVE)) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;  // XMM and YMM state enabled
  }();
  return yes;
}

// The same results as to_fp16 / from_fp16 bit for bit (round to nearest even; NaN quiet with its
// top payload bits), 8 elements at a time; the rest by the portable functions.
__attribute__((target("avx,f16c"))) inline void encode(const float* src, std::size_t n,
                                                       std::uint16_t* dst) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = to_fp16(src[i]);
}
template <bool Add>
__attribute__((target("avx,f16c"))) inline void decode(const std::uint16_t* src, std::size_t n,
                                                       float* dst) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    if constexpr (Add) v = _mm256_add_ps(_mm256_loadu_ps(dst + i), v);
    _mm256_storeu_ps(dst + i, v);
  }
  for (; i < n; ++i) {
    if constexpr (Add)
      dst[i] += from_fp16(src[i]);
    else
      dst[i] = from_fp16(src[i]);
  }
}
#else
inline bool available() noexcept { return false; }
inline void encode(const float*, std::size_t, std::uint16_t*) noexcept {}
template <bool Add>
inline void decode(const std::uint16_t*, std::size_t, float*) noexcept {}
#endif
}  // namespace f16c

/// n elements of src in 16-bit encoding e (fp16, bf16 or bf16_trunc), 2 bytes each at dst.
template <class T>
void encode_16bit(encoding e, const T* src, std::size_t n, std::byte* dst) noexcept {
  auto* out = reinterpret_cast<std::uint16_t*>(dst);
  if constexpr (std::is_same_v<T, float>)
    if (e == encoding::fp16 && f16c::available()) return f16c::encode(src, n, out);
  if (e == encoding::fp16)
    convert_elements(src, n, out, [](T x) { return to_fp16(x); });
  else if (e == encoding::bf16)
    convert_elements(src, n, out, [](T x) { return to_bf16(x); });
  else
    convert_elements(src, n, out, [](T x) { return to_bf16_trunc(x); });
}

/// dst[i] = element i of n 16-bit elements at src (Add: dst[i] += it).
template <bool Add, class T>
void decode_16bit(encoding e, const std::byte* src, std::size_t n, T* dst) noexcept {
  const auto* in = reinterpret_cast<const std::uint16_t*>(src);
  if constexpr (std::is_same_v<T, float>)
    if (e == encoding::fp16 && f16c::available()) return f16c::decode<Add>(in, n, dst);
  if (e == encoding::fp16)
    convert_elements<Add>(in, n, dst, [](std::uint16_t h) { return static_cast<T>(from_fp16(h)); });
  else  // bf16 and bf16_trunc decode alike
    convert_elements<Add>(in, n, dst, [](std::uint16_t h) { return static_cast<T>(from_bf16(h)); });
}

/// Payload bytes of n elements in 2-bit codes.
inline std::uint64_t two_bit_bytes(std::uint64_t n) noexcept {
  return encoded_bytes(encoding::two_bit, n, 0);
}

/// One 2-bit code per element with error feedback (one pass of encode_two_bit).
template <class T>
inline void two_bit_codes(const T* __restrict grad, T* __restrict residual, std::size_t n, T t,
                          std::uint8_t* __restrict codes) noexcept {
  auto run = [t](const T* __restrict g, T* __restrict res, std::size_t m,
                 std::uint8_t* __restrict c) {
    for (std::size_t i = 0; i < m; ++i) {
      const T r = res[i] + g[i];
      const int pos = r >= t, neg = r <= -t;  // int, not bool: bool -> T stays scalar
      res[i] = r - t * static_cast<T>(pos - neg);
      c[i] = static_cast<std::uint8_t>(pos | (neg << 1));
    }
  };
  std::size_t i = 0;
  for (; i + block <= n; i += block) run(grad + i, residual + i, block, codes + i);
  run(grad + i, residual + i, n - i, codes + i);
}

/// Four codes (one per byte) per byte, element 4j + k in bits 2k of byte j.
inline void pack_two_bit(const std::uint8_t* __restrict codes, std::size_t nbytes,
                         std::uint8_t* __restrict out) noexcept {
  auto run = [](const std::uint8_t* __restrict c, std::size_t m, std::uint8_t* __restrict o) {
    for (std::size_t j = 0; j < m; ++j)
      o[j] = static_cast<std::uint8_t>(c[4 * j] | (c[4 * j + 1] << 2) | (c[4 * j + 2] << 4) |
                                       (c[4 * j + 3] << 6));
  };
  std::size_t j = 0;
  for (; j + block <= nbytes; j += block) run(codes + 4 * j, block, out + j);
  run(codes + 4 * j, nbytes - j, out + j);
}

/// MXNet's 2-bit quantization with error feedback, for n elements: r = residual + grad sends +t
/// when r >= t (keeping r - t), -t when r <= -t (keeping r + t), else 0 (keeping r). Writes
/// two_bit_bytes(n) bytes at dst and the new residuals over the old.
template <class T>
void encode_two_bit(const T* grad, T* residual, std::size_t n, float t, std::byte* dst) noexcept {
  if (!n) return;
  std::memcpy(dst, &t, sizeof t);
  auto* out = reinterpret_cast<std::uint8_t*>(dst + two_bit_head);
  // Two passes over blocks, each a loop that vectorizes: one code per byte (and the residuals),
  // then four codes per byte. One fused loop mixes float and byte strides and stays scalar.
  constexpr std::size_t block = 1024;
  alignas(16) std::uint8_t codes[block];
  for (std::size_t b = 0; b < n; b += block) {
    const std::size_t m = std::min(block, n - b);
    two_bit_codes(grad + b, residual + b, m, static_cast<T>(t), codes);
    for (std::size_t i = m; i % 4; ++i) codes[i] = 3;  // padding, in the payload's last byte only
    pack_two_bit(codes, (m + 3) / 4, out + b / 4);
  }
}

/// What the 2-bit code in the low bits of `bits` stands for, as a multiple of t: 1 -> 1,
/// 2 -> -1, 0 (and padding, 3) -> 0.
inline int two_bit_sign(unsigned bits) noexcept {
  return static_cast<int>(bits & 1u) - static_cast<int>(bits >> 1 & 1u);
}

/// One code per byte from four per byte: codes[4j + k] = code k of byte j.
inline void spread_two_bit(const std::uint8_t* __restrict bytes, std::size_t nbytes,
                           std::uint8_t* __restrict codes) noexcept {
  auto run = [](const std::uint8_t* __restrict b, std::size_t m, std::uint8_t* __restrict c) {
    for (std::size_t j = 0; j < m; ++j) {
      const std::uint32_t x = b[j];
      const std::uint32_t w = (x | x << 6 | x << 12 | x << 18) & 0x03030303u;  // LE bytes
      std::memcpy(c + 4 * j, &w, sizeof w);
    }
  };
  std::size_t j = 0;
  for (; j + block <= nbytes; j += block) run(bytes + j, block, codes + 4 * j);
  run(bytes + j, nbytes - j, codes + 4 * j);
}

/// dst[4j + k] = the value of code k of byte j, for nbytes bytes (Add: dst[...] += it).
template <bool Add, class T>
inline void unpack_two_bit(const std::uint8_t* bytes, std::size_t nbytes, T t, T* dst) noexcept {
  // Two passes, as encode_two_bit: spread the codes to a byte each, then convert.
  constexpr std::size_t chunk = 256;  // bytes per pass: 1024 elements
  alignas(16) std::uint8_t codes[4 * chunk];
  for (std::size_t b = 0; b < nbytes; b += chunk) {
    const std::size_t m = std::min(chunk, nbytes - b);
    spread_two_bit(bytes + b, m, codes);
    convert_elements<Add>(codes, 4 * m, dst + 4 * b,
                          [t](std::uint8_t c) { return t * static_cast<T>(two_bit_sign(c)); });
  }
}

/// dst[i] = element first + i of the 2-bit codes at `codes` (Add: dst[i] += it), n elements.
template <bool Add, class T>
void decode_two_bit(const std::uint8_t* codes, std::uint64_t first, std::size_t n, T t,
                    T* dst) noexcept {
  auto one = [&](std::size_t i) {  // element first + i alone: the ends of an unaligned range
    const std::uint64_t e = first + i;
    const T v = t * static_cast<T>(two_bit_sign(codes[e / 4] >> (2 * (e % 4))));
    if constexpr (Add)
      dst[i] += v;
    else
      dst[i] = v;
  };
  std::size_t i = 0;
  for (; i < n && (first + i) % 4; ++i) one(i);
  const std::size_t whole = (n - i) / 4;
  unpack_two_bit<Add>(codes + (first + i) / 4, whole, t, dst + i);
  for (i += 4 * whole; i < n; ++i) one(i);
}

/// Whether any of n packed bytes holds code 3 (padding).
inline bool has_padding_code(const std::uint8_t* __restrict bytes, std::size_t n) noexcept {
  auto run = [](const std::uint8_t* __restrict b, std::size_t m) {
    unsigned threes = 0;  // bit 2k of a byte: its code k has both bits set
    for (std::size_t j = 0; j < m; ++j) threes |= b[j] & (b[j] >> 1) & 0x55u;
    return threes;
  };
  unsigned threes = 0;
  std::size_t j = 0;
  for (; j + block <= n; j += block) threes |= run(bytes + j, block);
  return (threes | run(bytes + j, n - j)) != 0;
}

// ---- a received payload --------------------------------------------------------------------

/// A received payload whose size (and 2-bit padding) checked out: `count` elements in encoding
/// `e`, read as T from any element on.
template <class T>
struct payload_view {
  encoding e = encoding::plain;
  const std::byte* data = nullptr;  // the elements (after a 2-bit payload's threshold)
  std::uint64_t count = 0;
  T threshold = 0;  // two_bit

  /// dst[i] = element first + i, for n elements (add: dst[i] += it).
  template <bool Add>
  void read(std::uint64_t first, std::size_t n, T* dst) const noexcept {
    if (e == encoding::two_bit)
      return decode_two_bit<Add>(reinterpret_cast<const std::uint8_t*>(data), first, n, threshold,
                                 dst);
    if (is_16bit(e)) return decode_16bit<Add>(e, data + 2 * first, n, dst);
    const T* src = reinterpret_cast<const T*>(data) + first;
    if constexpr (Add) {
      convert_elements<true>(src, n, dst, [](T x) { return x; });
    } else if (n) {
      std::memcpy(dst, src, n * sizeof(T));
    }
  }
  void copy_to(std::uint64_t first, std::size_t n, T* dst) const noexcept {
    read<false>(first, n, dst);
  }
  void add_to(std::uint64_t first, std::size_t n, T* dst) const noexcept {
    read<true>(first, n, dst);
  }
};

/// Checks a payload in encoding e for elements of T and views it. Throws error(protocol) when
/// its size does not match the encoding, a 2-bit payload's threshold is not finite and > 0, or
/// its codes are malformed.
template <class T>
payload_view<T> view_payload(encoding e, std::span<const std::byte> payload) {
  payload_view<T> v;
  v.e = e;
  v.data = payload.data();
  const std::size_t size = payload.size();
  auto bad = [&](const std::string& what) {
    throw error(errc::protocol, std::string("a ") + encoding_name(e) + " payload of " +
                                    std::to_string(size) + " bytes: " + what);
  };
  if (e == encoding::plain || is_16bit(e)) {
    const std::size_t unit = e == encoding::plain ? sizeof(T) : 2;
    if (size % unit) bad("not a whole number of " + std::to_string(unit) + "-byte elements");
    v.count = size / unit;
    return v;
  }
  if (e != encoding::two_bit) bad("an encoding this program does not know");
  if (size == 0) return v;
  if (size <= two_bit_head) bad("no codes after the threshold");
  float t;
  std::memcpy(&t, payload.data(), sizeof t);
  if (!(std::isfinite(t) && t > 0))
    bad("threshold " + std::to_string(t) + " is not finite and > 0");
  v.threshold = static_cast<T>(t);
  v.data = payload.data() + two_bit_head;
  const auto* codes = reinterpret_cast<const std::uint8_t*>(v.data);
  const std::size_t nbytes = size - two_bit_head;
  // Code 3 (both bits set) only pads the last byte.
  if (has_padding_code(codes, nbytes - 1)) bad("padding (code 3) before its last byte");
  const unsigned last = codes[nbytes - 1];
  unsigned used = 4;
  while (used && (last >> (2 * (used - 1)) & 3u) == 3u) --used;
  if (!used) bad("a last byte of padding only");
  for (unsigned k = 0; k < used; ++k)
    if ((last >> (2 * k) & 3u) == 3u) bad("padding (code 3) between elements");
  v.count = 4 * (nbytes - 1) + used;
  return v;
}

}  // namespace kvstore::wire
