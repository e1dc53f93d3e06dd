// The 16-bit payload encodings (wire/encoding.hpp): float or double <-> IEEE half (fp16) and
// bfloat16 (bf16 rounded to nearest even, bf16_trunc the high 16 bits), one element branch-free
// and whole arrays in loops that vectorize, fp16 by F16C where the CPU has it.
#pragma once

#include <kvstore/wire/element_loops.hpp>
#include <kvstore/wire/frame.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
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

}  // namespace kvstore::wire
