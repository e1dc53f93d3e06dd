// The launches of reduce/thrust.hpp's passes on a device's stream: a grid-stride kernel on CUDA,
// an OpenMP SIMD loop on the OMP build (device/runtime.hpp says which). fused_sum_update (the
// k-way sum with an optimizer step, in passes of at most max_fused_inputs inputs), rows_update
// and gather_rows are what push_pull.hpp, rows.hpp and staging.hpp call. They stay in namespace
// kvstore::reduce with the functors they launch.
#pragma once

#include <kvstore/device/runtime.hpp>
#include <kvstore/reduce/thrust.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvstore::reduce {

namespace device_detail {

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
