// The device kernels' arithmetic, as element-wise functors (device/kernels.hpp runs them on a
// stream: a grid-stride kernel on CUDA, an OpenMP loop on the OMP build): a fused k-way sum that,
// in the same pass, stores the sum or applies an optimizer to the stored weight; the same for
// rows of a matrix key; and the gather of rows. device_update says which optimizer step a pass
// applies. Free of the device runtime (and of Thrust and CUDA calls): only what one element does.
//
// Memory-bound, so each input element is read once and each output written once. Sums are formed
// left to right (((s0 + s1) + s2) + ...) as reduce/cpu.hpp does, so results match KVStore<local>
// bit for bit where the arithmetic is exact in T and the compiler does not contract a*b+c (the OMP
// build; nvcc contracts by default, so CUDA optimizer results may differ in the last bit).
// On CUDA, when every pointer is 16-byte aligned, each thread moves 16 bytes per input (one
// vector load: a pack) instead of one element.
#pragma once

#include <kvstore/detail/hd.hpp>
#include <kvstore/optim/elementwise.hpp>

#include <cstddef>
#include <cstdint>

// Unrolled loops over compile-time trip counts (the sources, the lanes of a pack).
#if defined(__CUDACC__)
#define KVSTORE_UNROLL _Pragma("unroll")
#else
#define KVSTORE_UNROLL _Pragma("GCC unroll 8")
#endif

namespace kvstore::reduce {

/// Inputs one fused pass reads; more are folded in by further passes (the sum order unchanged).
inline constexpr int max_fused_inputs = 8;

namespace device_detail {

// What a pass does with the sum g of its inputs at one element: store it, or update the weight
// (and its optimizer slots) with it as the gradient.
template <class T>
struct store_op {
  KVSTORE_HD void operator()(T g, T& w, T&, T&) const { w = g; }
};
template <class T>
struct sgd_op {
  kvstore::detail::sgd_step<T> st;
  KVSTORE_HD void operator()(T g, T& w, T& mom, T&) const { st(g, w, mom); }
};
template <class T>
struct adam_op {
  kvstore::detail::adam_step<T> st;
  KVSTORE_HD void operator()(T g, T& w, T& m, T& v) const { st(g, w, m, v); }
};
template <class T>
struct adagrad_op {
  kvstore::detail::adagrad_step<T> st;
  KVSTORE_HD void operator()(T g, T& w, T& h, T&) const { st(g, w, h); }
};

// V consecutive elements, aligned so that one load moves them all.
template <class T, int V>
struct alignas(sizeof(T) * V) pack {
  T v[V];
};

/// Element (or pack) i: g = src[0][i] + ... + src[K-1][i]; op(g, w[i], s0[i], s1[i]).
/// Slots an op does not use may be null (they are then not touched).
template <class T, int K, int V, class Op>
struct fused_fn {
  const T* src[K];
  T* w;
  T* s0;
  T* s1;
  Op op;

  KVSTORE_HD void operator()(std::size_t i) const {
    using P = pack<T, V>;
    P g = reinterpret_cast<const P*>(src[0])[i];
    KVSTORE_UNROLL
    for (int j = 1; j < K; ++j) {
      const P x = reinterpret_cast<const P*>(src[j])[i];
      KVSTORE_UNROLL
      for (int l = 0; l < V; ++l) g.v[l] = g.v[l] + x.v[l];
    }
    P wv = reinterpret_cast<const P*>(w)[i];
    P a{}, b{};
    if (s0) a = reinterpret_cast<const P*>(s0)[i];
    if (s1) b = reinterpret_cast<const P*>(s1)[i];
    KVSTORE_UNROLL
    for (int l = 0; l < V; ++l) op(g.v[l], wv.v[l], a.v[l], b.v[l]);
    reinterpret_cast<P*>(w)[i] = wv;
    if (s0) reinterpret_cast<P*>(s0)[i] = a;
    if (s1) reinterpret_cast<P*>(s1)[i] = b;
  }
};

/// Rows: element e of the unique rows' block, e = u * rl + c: g = the sum of the values of row
/// urow[u] (value rows idx[off[u]] .. idx[off[u+1]-1], in that order), applied to w's row.
template <class T, class Op>
struct rows_fn {
  const T* values;
  const std::int64_t* urow;
  const std::uint64_t* off;
  const std::uint64_t* idx;
  std::size_t rl;
  T* w;
  T* s0;
  T* s1;
  Op op;

  KVSTORE_HD void operator()(std::size_t e) const {
    const std::size_t u = e / rl, c = e % rl;
    const std::uint64_t b = off[u], end = off[u + 1];
    T g = values[idx[b] * rl + c];
    for (std::uint64_t j = b + 1; j < end; ++j) g = g + values[idx[j] * rl + c];
    const std::size_t at = static_cast<std::size_t>(urow[u]) * rl + c;
    T dummy0{}, dummy1{};
    op(g, w[at], s0 ? s0[at] : dummy0, s1 ? s1[at] : dummy1);
  }
};

/// out[i * rl + c] = w[rows[i] * rl + c].
template <class T>
struct gather_fn {
  const T* w;
  const std::int64_t* rows;
  std::size_t rl;
  T* out;
  KVSTORE_HD void operator()(std::size_t e) const {
    const std::size_t i = e / rl, c = e % rl;
    out[e] = w[static_cast<std::size_t>(rows[i]) * rl + c];
  }
};

}  // namespace device_detail

/// What a push does with the sum of its values, per element. `kind` picks the optimizer, whose
/// step (parameters converted to T, the step number folded in for adam) is the matching member.
template <class T>
struct device_update {
  enum kind_t { store, sgd, adam, adagrad } kind = store;
  kvstore::detail::sgd_step<T> sgd_st{kvstore::detail::grad_prep<T>(1, -1), T{}, T{}, T{}, false};
  kvstore::detail::adam_step<T> adam_st{
      kvstore::detail::grad_prep<T>(1, -1), T{}, T{}, T{}, T{}, T{}, T{}, T{}};
  kvstore::detail::adagrad_step<T> adagrad_st{kvstore::detail::grad_prep<T>(1, -1), T{}, T{}, T{}};
  /// Optimizer slots the kind reads and writes.
  int slots() const noexcept {
    return kind == adam ? 2 : kind == store ? 0 : (kind == sgd && !sgd_st.momentum ? 0 : 1);
  }
};

namespace device_detail {
template <class T, class F>
void with_op(const device_update<T>& u, F&& f) {
  switch (u.kind) {
    case device_update<T>::store:
      return f(store_op<T>{});
    case device_update<T>::sgd:
      return f(sgd_op<T>{u.sgd_st});
    case device_update<T>::adam:
      return f(adam_op<T>{u.adam_st});
    case device_update<T>::adagrad:
      return f(adagrad_op<T>{u.adagrad_st});
  }
}
}  // namespace device_detail

}  // namespace kvstore::reduce
