// AdaGrad (Duchi et al.), MXNet's adagrad_update.
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

/// AdaGrad: g = clip(rescale_grad * grad); `h += g^2`;
/// `w -= learning_rate * (g / (sqrt(h) + epsilon) + weight_decay * w)`.
/// As in MXNet, weight decay is applied to the weight directly and does not enter the history.
/// clip_gradient <= 0 means no clipping. One slot: the history h. With a `schedule`,
/// learning_rate is its base rate (optim/schedule.hpp).
struct adagrad {
  double learning_rate = 0.01;
  double epsilon = 1e-7;
  double weight_decay = 0;
  double rescale_grad = 1;
  double clip_gradient = -1;
  lr_schedule schedule{};

  static constexpr std::string_view name = "adagrad";
  static constexpr int num_slots = 1;
  static constexpr bool elementwise = true;  // chunks may be updated in parallel

  /// The per-element step with these parameters, the learning rate and weight decay scaled by
  /// a key's multipliers (shared with the device kernels).
  template <class T>
  kvstore::detail::adagrad_step<T> step(double lr_mult = 1, double wd_mult = 1,
                                        std::uint64_t t = 1) const {
    return {kvstore::detail::grad_prep<T>(rescale_grad, clip_gradient),
            static_cast<T>(schedule.rate(learning_rate, t) * lr_mult), static_cast<T>(epsilon),
            static_cast<T>(weight_decay * wd_mult)};
  }

  /// Precondition: grad, weight and the slot have the same size (checked by the store).
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight, const slots_view<T>& s) const {
    const kvstore::detail::adagrad_step<T> st = step<T>(s.lr_mult, s.wd_mult, s.step);
    const std::size_t n = weight.size();
    T* w = weight.data();
    const T* gr = grad.data();
    T* h = s.slot[0].data();
    std::size_t i = 0;
    if constexpr (std::is_same_v<T, float>) i = kvstore::detail::adagrad_x4(st, gr, w, h, n);
    for (; i < n; ++i) st(gr[i], w[i], h[i]);
  }

  template <class Ar>
  void serialize(Ar& ar, unsigned /*version*/) {
    ar& learning_rate& epsilon& weight_decay& rescale_grad& clip_gradient& schedule;
  }
};

}  // namespace kvstore::optim
