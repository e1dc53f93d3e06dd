// The gradient preprocessing every built-in optimizer shares (MXNet's order: rescale, then clip).
#pragma once

#include <algorithm>
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

  T operator()(T grad) const { return std::min(std::max(rescale * grad, -bound), bound); }
};

}  // namespace kvstore::detail
