// The 2-bit payload encoding (wire/encoding.hpp): MXNet's codes with error feedback, 0, +t or
// -t per element after the threshold t, four codes a byte; encoded, decoded from any element on,
// and the padding code found, in loops that vectorize.
#pragma once

#include <kvstore/wire/element_loops.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvstore::wire {

/// The threshold in front of a 2-bit payload's codes.
inline constexpr std::size_t two_bit_head = 4;

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

}  // namespace kvstore::wire
