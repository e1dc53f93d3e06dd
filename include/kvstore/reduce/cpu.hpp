// The CPU reduction: dst = src[0] + src[1] + ... + src[k-1], elementwise.
//
// It is memory-bound, so the one thing that matters is touching memory once: every input element
// is read once and every output element written once, whatever k is. Up to four inputs are summed
// in a single loop; more are folded in, three at a time, into an output block small enough
// (block_elems) to stay in cache between the folds. Inner loops run over contiguous elements of
// `__restrict` pointers in fixed-width groups, which the compiler turns into vector code at -O2
// too (a fixed trip count needs no cost model), plus a scalar tail.
//
// Sums are formed left to right (((s0 + s1) + s2) + ...), the order a plain loop uses, so results
// are reproducible and, for values that are exact in T, exact.
#pragma once

#include <kvstore/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

namespace kvstore::reduce {

/// What a parallel reduction runs on: `size()` threads and `parallel_for(n, grain, f)` calling
/// f(begin, end) over [0, n) on them and the calling thread (detail::engine is one).
template <class E>
concept executor = requires(E& e, void (*f)(std::size_t, std::size_t)) {
  { e.size() } -> std::convertible_to<std::size_t>;
  e.parallel_for(std::size_t{1}, std::size_t{1}, f);
};

/// Elements per block of the output when more than four inputs are folded in.
inline constexpr std::size_t block_elems = 4096;

namespace detail {

// Elements handled per step of the unrolled loops: 64 bytes of float, 128 of double.
inline constexpr std::size_t lanes = 16;

template <class T>
void copy1(T* __restrict d, const T* __restrict a, std::size_t n) {
  if (n != 0) std::memcpy(d, a, n * sizeof(T));
}

template <class T>
void add2(T* __restrict d, const T* __restrict a, const T* __restrict b, std::size_t n) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j) d[i + j] = a[i + j] + b[i + j];
  for (; i < n; ++i) d[i] = a[i] + b[i];
}

template <class T>
void add3(T* __restrict d, const T* __restrict a, const T* __restrict b, const T* __restrict c,
          std::size_t n) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j) d[i + j] = a[i + j] + b[i + j] + c[i + j];
  for (; i < n; ++i) d[i] = a[i] + b[i] + c[i];
}

template <class T>
void add4(T* __restrict d, const T* __restrict a, const T* __restrict b, const T* __restrict c,
          const T* __restrict e, std::size_t n) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j) d[i + j] = a[i + j] + b[i + j] + c[i + j] + e[i + j];
  for (; i < n; ++i) d[i] = a[i] + b[i] + c[i] + e[i];
}

// d += a (+ b (+ c)), keeping the left-to-right order: ((d + a) + b) + c.
template <class T>
void acc1(T* __restrict d, const T* __restrict a, std::size_t n) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j) d[i + j] = d[i + j] + a[i + j];
  for (; i < n; ++i) d[i] = d[i] + a[i];
}

template <class T>
void acc2(T* __restrict d, const T* __restrict a, const T* __restrict b, std::size_t n) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j) d[i + j] = d[i + j] + a[i + j] + b[i + j];
  for (; i < n; ++i) d[i] = d[i] + a[i] + b[i];
}

template <class T>
void acc3(T* __restrict d, const T* __restrict a, const T* __restrict b, const T* __restrict c,
          std::size_t n) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j) d[i + j] = d[i + j] + a[i + j] + b[i + j] + c[i + j];
  for (; i < n; ++i) d[i] = d[i] + a[i] + b[i] + c[i];
}

// Elements [b, e) of the sum; the sizes are already checked.
template <class T>
void sum_range(T* d, std::span<const std::span<const T>> s, std::size_t b, std::size_t e) {
  const std::size_t k = s.size();
  auto p = [&](std::size_t i, std::size_t at) { return s[i].data() + at; };
  switch (k) {
    case 0:
      std::fill(d + b, d + e, T{});
      return;
    case 1:
      copy1(d + b, p(0, b), e - b);
      return;
    case 2:
      add2(d + b, p(0, b), p(1, b), e - b);
      return;
    case 3:
      add3(d + b, p(0, b), p(1, b), p(2, b), e - b);
      return;
    case 4:
      add4(d + b, p(0, b), p(1, b), p(2, b), p(3, b), e - b);
      return;
    default:
      break;
  }
  // k > 4: per block, the first four inputs make the block, the rest fold into it while it is
  // still in cache.
  for (std::size_t at = b; at < e; at += block_elems) {
    const std::size_t n = std::min(block_elems, e - at);
    T* db = d + at;
    add4(db, p(0, at), p(1, at), p(2, at), p(3, at), n);
    std::size_t i = 4;
    for (; i + 3 <= k; i += 3) acc3(db, p(i, at), p(i + 1, at), p(i + 2, at), n);
    if (k - i == 2)
      acc2(db, p(i, at), p(i + 1, at), n);
    else if (k - i == 1)
      acc1(db, p(i, at), n);
  }
}

template <class T>
void check_sizes(std::span<T> dst, std::span<const std::span<const T>> srcs) {
  for (std::size_t i = 0; i < srcs.size(); ++i) {
    if (srcs[i].size() != dst.size())
      throw error(errc::size_mismatch, "kvstore: sum_into: input " + std::to_string(i) + " has " +
                                           std::to_string(srcs[i].size()) +
                                           " elements, the output " + std::to_string(dst.size()));
  }
}

}  // namespace detail

/// dst[i] = srcs[0][i] + ... + srcs[k-1][i] (k = 0: zeros; k = 1: a copy), on the calling thread.
/// dst must not overlap any input. Throws kvstore::error (size_mismatch) when an input's size
/// differs from dst's; dst is then unchanged.
template <class T>
void sum_into(std::span<T> dst, std::span<const std::span<const T>> srcs) {
  detail::check_sizes(dst, srcs);
  detail::sum_range(dst.data(), srcs, 0, dst.size());
}

/// As above, but with dst.size() >= parallel_min the elements are split, in whole blocks, over
/// the executor's threads and the calling thread (the engine's parallel_for is safe from inside a
/// task).
template <class T, executor Executor>
void sum_into(Executor& eng, std::span<T> dst, std::span<const std::span<const T>> srcs,
              std::size_t parallel_min = std::size_t{1} << 16) {
  detail::check_sizes(dst, srcs);
  const std::size_t n = dst.size();
  if (n < parallel_min || n < 2 * block_elems || eng.size() == 0) {
    detail::sum_range(dst.data(), srcs, 0, n);
    return;
  }
  const std::size_t blocks = (n + block_elems - 1) / block_elems;
  T* d = dst.data();
  eng.parallel_for(blocks, 1, [d, srcs, n](std::size_t b, std::size_t e) {
    detail::sum_range(d, srcs, b * block_elems, std::min(n, e * block_elems));
  });
}

}  // namespace kvstore::reduce
