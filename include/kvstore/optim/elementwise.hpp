// The per-element arithmetic of the built-in optimizers, shared by the CPU loops (optim/sgd.hpp,
// adam.hpp, adagrad.hpp) and the device kernels (reduce/thrust.hpp), so a weight updated on a
// GPU or on the CPU goes through the same expressions in the same order. Each step holds its
// parameters already converted to T; building one is host code, applying it is KVSTORE_HD.
#pragma once

#include <kvstore/detail/hd.hpp>
#include <kvstore/optim/grad.hpp>

#include <cmath>

namespace kvstore::detail {

/// SGD on one element: without momentum `w -= lr * g`, with it `mom = mu mom - lr g; w += mom`,
/// where g = prep(grad) + wd * w.
template <class T>
struct sgd_step {
  grad_prep<T> prep;
  T lr, wd, mu;
  bool momentum;

  KVSTORE_HD void operator()(T grad, T& w, T& mom) const {
    const T g = prep(grad) + wd * w;
    if (momentum) {
      mom = mu * mom - lr * g;
      w += mom;
    } else {
      w -= lr * g;
    }
  }
};

/// Adam on one element at a step whose bias-corrected rate is lr_t.
template <class T>
struct adam_step {
  grad_prep<T> prep;
  T lr_t, b1, b2, c1, c2, eps, wd;

  KVSTORE_HD void operator()(T grad, T& w, T& m, T& v) const {
    using std::sqrt;
    const T g = prep(grad) + wd * w;
    m = b1 * m + c1 * g;
    v = b2 * v + c2 * g * g;
    w -= lr_t * m / (sqrt(v) + eps);
  }
};

/// AdaGrad on one element: `h += g^2; w -= lr (g / (sqrt(h) + eps) + wd w)`.
template <class T>
struct adagrad_step {
  grad_prep<T> prep;
  T lr, eps, wd;

  KVSTORE_HD void operator()(T grad, T& w, T& h) const {
    using std::sqrt;
    const T g = prep(grad);
    h += g * g;
    w -= lr * (g / (sqrt(h) + eps) + wd * w);
  }
};

}  // namespace kvstore::detail
