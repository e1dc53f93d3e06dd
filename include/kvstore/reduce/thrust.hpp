// The device kernels, as element-wise functors run by a grid-stride kernel on a stream (CUDA) or
// by an OpenMP loop (the OMP build): a fused k-way sum that, in the same pass, stores
// the sum or applies an optimizer to the stored weight; the same for rows of a matrix key; and
// the gather of rows.
//
// Memory-bound, so each input element is read once and each output written once. Sums are formed
// left to right (((s0 + s1) + s2) + ...) as reduce/cpu.hpp does, so results match KVStore<local>
// bit for bit where the arithmetic is exact in T and the compiler does not contract a*b+c (the OMP
// build; nvcc contracts by default, so CUDA optimizer results may differ in the last bit).
// On CUDA, when every pointer is 16-byte aligned, each thread moves 16 bytes per input (one
// vector load) instead of one element.
#pragma once

#include <kvstore/detail/hd.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/optim/elementwise.hpp>

#include <thrust/detail/config.h>

#include <algorithm>
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

#if KVSTORE_DEVICE_CUDA
inline constexpr unsigned block_threads = 256;

// f(i) for i < n, one index per thread per step of a grid-stride loop: one plain launch per pass,
// with nothing queried from the device per call (the per-op cost matters for small keys).
template <class F>
__global__ void __launch_bounds__(block_threads) for_each_kernel(F f, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}
#endif

/// Runs f(0) .. f(n-1) on stream s: a kernel on CUDA (no host sync); on the OMP build an OpenMP
/// SIMD loop (split over threads for large n: a parallel region costs more than small work). The
/// functors write only their own element of outputs that no input overlaps, so the loop is
/// declared free of dependences: with a run-time count of pointers the compiler could not prove
/// it and would not vectorize.
template <class F>
void launch(kvstore::detail::rt::stream_t s, std::size_t n, const F& f) {
  if (n == 0) return;
#if KVSTORE_DEVICE_CUDA
  const std::size_t blocks =
      std::min<std::size_t>((n + block_threads - 1) / block_threads, std::size_t{1} << 30);
  for_each_kernel<<<static_cast<unsigned>(blocks), block_threads, 0, s>>>(f, n);
  kvstore::detail::rt::check_launch("kernel launch");
#else
  (void)s;
  if (n < (std::size_t{1} << 15)) {
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) f(i);
  } else {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < n; ++i) f(i);
  }
#endif
}

template <class T, int K, class Op>
void fused_k(kvstore::detail::rt::stream_t s, const T* const* src, T* w, T* s0, T* s1,
             std::size_t n, const Op& op) {
  constexpr int V = kvstore::detail::rt::is_cuda ? int(16 / sizeof(T)) : 1;
  bool aligned = V > 1;
  auto al = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  for (int j = 0; j < K && aligned; ++j) aligned = al(src[j]);
  aligned = aligned && al(w) && (!s0 || al(s0)) && (!s1 || al(s1));
  std::size_t head = 0;
  if constexpr (V > 1) {
    if (aligned) {
      fused_fn<T, K, V, Op> f{{}, w, s0, s1, op};
      for (int j = 0; j < K; ++j) f.src[j] = src[j];
      head = n / V * V;
      launch(s, n / V, f);
    }
  }
  if (head == n) return;
  fused_fn<T, K, 1, Op> f{{}, w + head, s0 ? s0 + head : nullptr, s1 ? s1 + head : nullptr, op};
  for (int j = 0; j < K; ++j) f.src[j] = src[j] + head;
  launch(s, n - head, f);
}

template <class T, class Op>
void fused_dispatch(kvstore::detail::rt::stream_t s, const T* const* src, int k, T* w, T* s0, T* s1,
                    std::size_t n, const Op& op) {
  switch (k) {
    case 1:
      return fused_k<T, 1>(s, src, w, s0, s1, n, op);
    case 2:
      return fused_k<T, 2>(s, src, w, s0, s1, n, op);
    case 3:
      return fused_k<T, 3>(s, src, w, s0, s1, n, op);
    case 4:
      return fused_k<T, 4>(s, src, w, s0, s1, n, op);
    case 5:
      return fused_k<T, 5>(s, src, w, s0, s1, n, op);
    case 6:
      return fused_k<T, 6>(s, src, w, s0, s1, n, op);
    case 7:
      return fused_k<T, 7>(s, src, w, s0, s1, n, op);
    case 8:
      return fused_k<T, 8>(s, src, w, s0, s1, n, op);
    default:
      break;
  }
}

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

/// On stream s: w[i] = u(src[0][i] + ... + src[k-1][i], w[i], slots) for i < n, in one pass when
/// k <= max_fused_inputs; more inputs are folded into `partial` (n elements; may be w itself when
/// u stores) by earlier passes, the last pass applying u. Every pointer must be readable by the
/// stream's device; `w` (and slots) must not overlap the inputs.
template <class T>
void fused_sum_update(kvstore::detail::rt::stream_t s, const T* const* src, int k, T* w, T* s0,
                      T* s1, T* partial, std::size_t n, const device_update<T>& u) {
  using namespace device_detail;
  if (k <= max_fused_inputs) {
    with_op(u, [&](const auto& op) { fused_dispatch<T>(s, src, k, w, s0, s1, n, op); });
    return;
  }
  // First pass: the first eight into partial; then seven more at a time, partial first.
  fused_dispatch<T>(s, src, max_fused_inputs, partial, nullptr, nullptr, n, store_op<T>{});
  int at = max_fused_inputs;
  const T* in[max_fused_inputs];
  while (at < k) {
    const int take = (k - at < max_fused_inputs - 1) ? k - at : max_fused_inputs - 1;
    in[0] = partial;
    for (int j = 0; j < take; ++j) in[1 + j] = src[at + j];
    at += take;
    if (at < k)
      fused_dispatch<T>(s, in, take + 1, partial, nullptr, nullptr, n, store_op<T>{});
    else
      with_op(u, [&](const auto& op) { fused_dispatch<T>(s, in, take + 1, w, s0, s1, n, op); });
  }
}

/// On stream s: for each unique row urow[u], g = the sum of its value rows (see rows_fn), applied
/// by u to that row of w. All arrays readable by the stream's device.
template <class T>
void rows_update(kvstore::detail::rt::stream_t s, const T* values, const std::int64_t* urow,
                 const std::uint64_t* off, const std::uint64_t* idx, std::size_t nunique,
                 std::size_t rl, T* w, T* s0, T* s1, const device_update<T>& u) {
  using namespace device_detail;
  with_op(u, [&](const auto& op) {
    using Op = std::decay_t<decltype(op)>;
    launch(s, nunique * rl, rows_fn<T, Op>{values, urow, off, idx, rl, w, s0, s1, op});
  });
}

/// On stream s: out (nrows * rl elements) = rows `rows` of w.
template <class T>
void gather_rows(kvstore::detail::rt::stream_t s, const T* w, const std::int64_t* rows,
                 std::size_t nrows, std::size_t rl, T* out) {
  device_detail::launch(s, nrows * rl, device_detail::gather_fn<T>{w, rows, rl, out});
}

}  // namespace kvstore::reduce
