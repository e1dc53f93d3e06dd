// Stochastic gradient descent with optional momentum, MXNet's sgd_update / sgd_mom_update.
#pragma once

#include <kvstore/optim/elementwise.hpp>
#include <kvstore/optim/grad.hpp>
#include <kvstore/optim/optimizer.hpp>
#include <kvstore/optim/schedule.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kvstore::optim {

/// SGD: g = clip(rescale_grad * grad) + weight_decay * w; with momentum > 0
/// `mom = momentum * mom - learning_rate * g; w += mom`, otherwise `w -= learning_rate * g`.
/// clip_gradient <= 0 means no clipping. One slot: the momentum (left untouched when momentum
/// is 0, so switching momentum on later starts from zero). With a `schedule`, learning_rate is
/// its base rate and update t uses schedule's rate at t (optim/schedule.hpp).
struct sgd {
  double learning_rate = 0.01;
  double momentum = 0;
  double weight_decay = 0;
  double rescale_grad = 1;
  double clip_gradient = -1;
  lr_schedule schedule{};

  static constexpr std::string_view name = "sgd";
  static constexpr int num_slots = 1;
  static constexpr bool elementwise = true;  // chunks may be updated in parallel

  /// The per-element step of update t (1 for a key's first) with these parameters, the learning
  /// rate and weight decay scaled by a key's multipliers (shared with the device kernels).
  template <class T>
  kvstore::detail::sgd_step<T> step(double lr_mult = 1, double wd_mult = 1,
                                    std::uint64_t t = 1) const {
    return {kvstore::detail::grad_prep<T>(rescale_grad, clip_gradient),
            static_cast<T>(schedule.rate(learning_rate, t) * lr_mult),
            static_cast<T>(weight_decay * wd_mult), static_cast<T>(momentum), momentum > 0};
  }

  /// Precondition: grad.size() == weight.size() == s.slot[0].size() (checked by the store).
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight, const slots_view<T>& s) const {
    const kvstore::detail::sgd_step<T> st = step<T>(s.lr_mult, s.wd_mult, s.step);
    const std::size_t n = weight.size();
    T* w = weight.data();
    const T* gr = grad.data();
    if (st.momentum) {
      T* mom = s.slot[0].data();
      for (std::size_t i = 0; i < n; ++i) st(gr[i], w[i], mom[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        T unused{};
        st(gr[i], w[i], unused);
      }
    }
  }

  template <class Ar>
  void serialize(Ar& ar, unsigned /*version*/) {
    ar& learning_rate& momentum& weight_decay& rescale_grad& clip_gradient& schedule;
  }
};

}  // namespace kvstore::optim
