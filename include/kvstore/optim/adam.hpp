// Adam (Kingma & Ba) with bias correction folded into the learning rate, MXNet's adam_update.
#pragma once

#include <kvstore/optim/grad.hpp>
#include <kvstore/optim/optimizer.hpp>

#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>

namespace kvstore::optim {

/// Adam: g = clip(rescale_grad * grad) + weight_decay * w; at step t (1 for the first update)
/// `lr_t = learning_rate * sqrt(1 - beta2^t) / (1 - beta1^t)`, `m = beta1 m + (1 - beta1) g`,
/// `v = beta2 v + (1 - beta2) g^2`, `w -= lr_t * m / (sqrt(v) + epsilon)`.
/// clip_gradient <= 0 means no clipping. Two slots: m and v.
struct adam {
  double learning_rate = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0;
  double rescale_grad = 1;
  double clip_gradient = -1;

  static constexpr std::string_view name = "adam";
  static constexpr int num_slots = 2;

  /// Precondition: grad, weight and both slots have the same size (checked by the store).
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight, const slots_view<T>& s) const {
    const kvstore::detail::grad_prep<T> prep(rescale_grad, clip_gradient);
    // The bias correction is a per-call scalar; compute it in double so that large step counts
    // do not lose it to float rounding.
    const double t = static_cast<double>(s.step == 0 ? 1 : s.step);
    const T lr_t = static_cast<T>(learning_rate * std::sqrt(1 - std::pow(beta2, t)) /
                                  (1 - std::pow(beta1, t)));
    const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2);
    const T c1 = static_cast<T>(1 - beta1), c2 = static_cast<T>(1 - beta2);
    const T eps = static_cast<T>(epsilon);
    const T wd = static_cast<T>(weight_decay);
    const std::size_t n = weight.size();
    T* w = weight.data();
    const T* gr = grad.data();
    T* m = s.slot[0].data();
    T* v = s.slot[1].data();
    for (std::size_t i = 0; i < n; ++i) {
      const T g = prep(gr[i]) + wd * w[i];
      m[i] = b1 * m[i] + c1 * g;
      v[i] = b2 * v[i] + c2 * g * g;
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }

  template <class Ar>
  void serialize(Ar& ar, unsigned /*version*/) {
    ar & learning_rate & beta1 & beta2 & epsilon & weight_decay & rescale_grad & clip_gradient;
  }
};

}  // namespace kvstore::optim
