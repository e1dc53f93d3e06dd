// Adam (Kingma & Ba) with bias correction folded into the learning rate, MXNet's adam_update.
#pragma once

#include <kvstore/optim/elementwise.hpp>
#include <kvstore/optim/grad.hpp>
#include <kvstore/optim/optimizer.hpp>
#include <kvstore/optim/schedule.hpp>
#include <kvstore/optim/simd.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

namespace kvstore::optim {

/// Adam: g = clip(rescale_grad * grad) + weight_decay * w; at step t (1 for the first update)
/// `lr_t = learning_rate * sqrt(1 - beta2^t) / (1 - beta1^t)`, `m = beta1 m + (1 - beta1) g`,
/// `v = beta2 v + (1 - beta2) g^2`, `w -= lr_t * m / (sqrt(v) + epsilon)`.
/// clip_gradient <= 0 means no clipping. Two slots: m and v. With a `schedule`, learning_rate is
/// its base rate and update t's lr_t starts from the schedule's rate at t (optim/schedule.hpp).
struct adam {
  double learning_rate = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0;
  double rescale_grad = 1;
  double clip_gradient = -1;
  lr_schedule schedule{};

  static constexpr std::string_view name = "adam";
  static constexpr int num_slots = 2;
  static constexpr bool elementwise = true;  // chunks may be updated in parallel

  /// The per-element step of update number `step` (1 for the first; 0 counts as 1), the learning
  /// rate and weight decay scaled by a key's multipliers; shared with the device kernels.
  template <class T>
  kvstore::detail::adam_step<T> step_at(std::uint64_t step, double lr_mult = 1,
                                        double wd_mult = 1) const {
    // The bias correction is a per-call scalar; compute it in double so that large step counts
    // do not lose it to float rounding.
    const double t = static_cast<double>(step == 0 ? 1 : step);
    return {kvstore::detail::grad_prep<T>(rescale_grad, clip_gradient),
            static_cast<T>(schedule.rate(learning_rate, step) * lr_mult *
                           std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t))),
            static_cast<T>(beta1),
            static_cast<T>(beta2),
            static_cast<T>(1 - beta1),
            static_cast<T>(1 - beta2),
            static_cast<T>(epsilon),
            static_cast<T>(weight_decay * wd_mult)};
  }

  /// Precondition: grad, weight and both slots have the same size (checked by the store).
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight, const slots_view<T>& s) const {
    const kvstore::detail::adam_step<T> st = step_at<T>(s.step, s.lr_mult, s.wd_mult);
    const std::size_t n = weight.size();
    T* w = weight.data();
    const T* gr = grad.data();
    T* m = s.slot[0].data();
    T* v = s.slot[1].data();
    std::size_t i = 0;
    if constexpr (std::is_same_v<T, float>) i = kvstore::detail::adam_x4(st, gr, w, m, v, n);
    for (; i < n; ++i) st(gr[i], w[i], m[i], v[i]);
  }

  template <class Ar>
  void serialize(Ar& ar, unsigned /*version*/) {
    ar& learning_rate& beta1& beta2& epsilon& weight_decay& rescale_grad& clip_gradient& schedule;
  }
};

}  // namespace kvstore::optim
