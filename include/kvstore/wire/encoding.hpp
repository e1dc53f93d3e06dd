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
//
// The conversions are wire/float16.hpp and wire/two_bit.hpp, over the loop of
// wire/element_loops.hpp; this file names the encodings, sizes their payloads and checks and
// views a received one (view_payload).
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/wire/element_loops.hpp>
#include <kvstore/wire/float16.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/two_bit.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

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

/// Payload bytes of n elements of `elem` bytes in encoding e (0 for no elements).
inline std::uint64_t encoded_bytes(encoding e, std::uint64_t n, std::size_t elem) noexcept {
  if (e == encoding::plain) return n * elem;
  if (e == encoding::two_bit) return n ? two_bit_head + (n + 3) / 4 : 0;
  return n * 2;
}

/// Payload bytes of n elements in 2-bit codes.
inline std::uint64_t two_bit_bytes(std::uint64_t n) noexcept {
  return encoded_bytes(encoding::two_bit, n, 0);
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
