// The loop every payload encoding runs over its elements (wire/encoding.hpp): one pure element
// conversion over blocks of a fixed count, on pointers that do not alias, so that it vectorizes.
#pragma once

#include <cstddef>

namespace kvstore::wire {

// GCC at -O2 vectorizes a loop only when it needs no run-time checks: its trip count a known
// multiple of the vector width and its pointers known not to alias. So every loop of the
// encodings (below, wire/float16.hpp, wire/two_bit.hpp) runs over blocks of exactly `block`
// elements (then the rest), on __restrict pointers that are parameters, not lambda captures; they
// vectorize at -O2 as at -O3, and with clang.
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

}  // namespace kvstore::wire
