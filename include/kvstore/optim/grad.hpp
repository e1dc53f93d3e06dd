// The gradient preprocessing every built-in optimizer shares (MXNet's order: rescale, then clip).
#pragma once

#include <kvstore/detail/hd.hpp>

#include <limits>

namespace kvstore::detail {

/// rescale_grad * grad, clipped to [-clip, clip] when clip > 0. Holds the parameters already
/// converted to T so the per-element work is two multiplies and a min/max: with clipping off the
/// bound is +inf, which keeps the loop branch-free (and so vectorizable) while leaving every
/// finite value, and NaN, unchanged.
template <class T>
struct grad_prep {
  T rescale;
  T bound;

  grad_prep(double rescale_grad, double clip_gradient)
      : rescale(static_cast<T>(rescale_grad)),
        bound(clip_gradient > 0 ? static_cast<T>(clip_gradient)
                                : std::numeric_limits<T>::infinity()) {}

  // std::min(std::max(x, -bound), bound) spelled out, so CUDA kernels can call it too; the same
  // comparisons in the same order, so NaN passes through as before.
  KVSTORE_HD T operator()(T grad) const {
    const T x = rescale * grad;
    const T lo = x < -bound ? -bound : x;
    return bound < lo ? bound : lo;
  }
};

}  // namespace kvstore::detail
