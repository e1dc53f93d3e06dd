// Stochastic gradient descent with optional momentum, MXNet's sgd_update / sgd_mom_update.
#pragma once

#include <kvstore/optim/grad.hpp>
#include <kvstore/optim/optimizer.hpp>

#include <cstddef>
#include <span>
#include <string_view>

namespace kvstore::optim {

/// SGD: g = clip(rescale_grad * grad) + weight_decay * w; with momentum > 0
/// `mom = momentum * mom - learning_rate * g; w += mom`, otherwise `w -= learning_rate * g`.
/// clip_gradient <= 0 means no clipping. One slot: the momentum (left untouched when momentum
/// is 0, so switching momentum on later starts from zero).
struct sgd {
  double learning_rate = 0.01;
  double momentum = 0;
  double weight_decay = 0;
  double rescale_grad = 1;
  double clip_gradient = -1;

  static constexpr std::string_view name = "sgd";
  static constexpr int num_slots = 1;

  /// Precondition: grad.size() == weight.size() == s.slot[0].size() (checked by the store).
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight, const slots_view<T>& s) const {
    const kvstore::detail::grad_prep<T> prep(rescale_grad, clip_gradient);
    const T lr = static_cast<T>(learning_rate);
    const T wd = static_cast<T>(weight_decay);
    const std::size_t n = weight.size();
    T* w = weight.data();
    const T* gr = grad.data();
    if (momentum > 0) {
      const T mu = static_cast<T>(momentum);
      T* mom = s.slot[0].data();
      for (std::size_t i = 0; i < n; ++i) {
        const T g = prep(gr[i]) + wd * w[i];
        mom[i] = mu * mom[i] - lr * g;
        w[i] += mom[i];
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const T g = prep(gr[i]) + wd * w[i];
        w[i] -= lr * g;
      }
    }
  }

  template <class Ar>
  void serialize(Ar& ar, unsigned /*version*/) {
    ar & learning_rate & momentum & weight_decay & rescale_grad & clip_gradient;
  }
};

}  // namespace kvstore::optim
