// SSE loops for the float steps that take a square root (Adam, AdaGrad). GCC does not vectorize
// their scalar loops: std::sqrt may set errno, and without -fno-math-errno (which a header
// library cannot choose for its users) every element pays a scalar sqrtss and a branch; one
// thread then updates 1.3-1.6 GB/s of gradient where these loops do 2.5 (a server's Adam is
// that loop, issue 12). Each lane runs the scalar step's operations in the same order
// (optim/elementwise.hpp: IEEE multiplies, adds, divides and sqrt, no contraction), so the
// results are the same bits; test_optim compares them element by element. SSE2 is part of
// x86-64, so no CPU check is needed; elsewhere, and in CUDA builds, the scalar loop runs.
#pragma once

#include <kvstore/optim/elementwise.hpp>

#include <cstddef>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#define KVSTORE_OPTIM_SSE 1
#else
#define KVSTORE_OPTIM_SSE 0
#endif

namespace kvstore::detail {

#if KVSTORE_OPTIM_SSE
/// grad_prep on four lanes: rescale, then the clip's two comparisons as selects (so NaN passes
/// through as in the scalar form).
struct grad_prep_x4 {
  __m128 rescale, bound, neg_bound;
  explicit grad_prep_x4(const grad_prep<float>& p)
      : rescale(_mm_set1_ps(p.rescale)),
        bound(_mm_set1_ps(p.bound)),
        neg_bound(_mm_set1_ps(-p.bound)) {}
  static __m128 select(__m128 mask, __m128 a, __m128 b) {
    return _mm_or_ps(_mm_and_ps(mask, a), _mm_andnot_ps(mask, b));
  }
  __m128 operator()(__m128 grad) const {
    const __m128 x = _mm_mul_ps(rescale, grad);
    const __m128 lo = select(_mm_cmplt_ps(x, neg_bound), neg_bound, x);
    return select(_mm_cmplt_ps(bound, lo), bound, lo);
  }
};
#endif

/// Adam over the first elements, four at a time; returns how many it did (a multiple of 4, or
/// 0 without SSE): the caller runs the scalar step on the rest.
inline std::size_t adam_x4(const adam_step<float>& st, const float* gr, float* w, float* m,
                           float* v, std::size_t n) {
#if KVSTORE_OPTIM_SSE
  const grad_prep_x4 prep(st.prep);
  const __m128 wd = _mm_set1_ps(st.wd), b1 = _mm_set1_ps(st.b1), c1 = _mm_set1_ps(st.c1),
               b2 = _mm_set1_ps(st.b2), c2 = _mm_set1_ps(st.c2), lr_t = _mm_set1_ps(st.lr_t),
               eps = _mm_set1_ps(st.eps);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m128 W = _mm_loadu_ps(w + i);
    const __m128 g = _mm_add_ps(prep(_mm_loadu_ps(gr + i)), _mm_mul_ps(wd, W));
    const __m128 M = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(m + i)), _mm_mul_ps(c1, g));
    const __m128 V =
        _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(c2, g), g));
    W = _mm_sub_ps(W, _mm_div_ps(_mm_mul_ps(lr_t, M), _mm_add_ps(_mm_sqrt_ps(V), eps)));
    _mm_storeu_ps(m + i, M);
    _mm_storeu_ps(v + i, V);
    _mm_storeu_ps(w + i, W);
  }
  return i;
#else
  (void)st, (void)gr, (void)w, (void)m, (void)v, (void)n;
  return 0;
#endif
}

/// AdaGrad over the first elements, four at a time; returns how many it did, as adam_x4.
inline std::size_t adagrad_x4(const adagrad_step<float>& st, const float* gr, float* w, float* h,
                              std::size_t n) {
#if KVSTORE_OPTIM_SSE
  const grad_prep_x4 prep(st.prep);
  const __m128 lr = _mm_set1_ps(st.lr), eps = _mm_set1_ps(st.eps), wd = _mm_set1_ps(st.wd);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 g = prep(_mm_loadu_ps(gr + i));
    const __m128 H = _mm_add_ps(_mm_loadu_ps(h + i), _mm_mul_ps(g, g));
    const __m128 W = _mm_loadu_ps(w + i);
    const __m128 step =
        _mm_add_ps(_mm_div_ps(g, _mm_add_ps(_mm_sqrt_ps(H), eps)), _mm_mul_ps(wd, W));
    _mm_storeu_ps(h + i, H);
    _mm_storeu_ps(w + i, _mm_sub_ps(W, _mm_mul_ps(lr, step)));
  }
  return i;
#else
  (void)st, (void)gr, (void)w, (void)h, (void)n;
  return 0;
#endif
}

}  // namespace kvstore::detail
