// w += g: the "gradient" is a delta added to the stored value (Multiverso's default updater).
#pragma once

#include <kvstore/optim/optimizer.hpp>

#include <cstddef>
#include <span>
#include <string_view>

namespace kvstore::optim {

/// Adds each push to the stored value. Unlike a store with no optimizer (where a push replaces
/// the value, or in dist_sync stores the round's sum), the pushes accumulate: in dist_sync the
/// round's sum of all workers' deltas is added once. No parameters, no state; the multipliers
/// of set_key_options do not apply (there is no learning rate).
struct add {
  static constexpr std::string_view name = "add";
  static constexpr int num_slots = 0;
  static constexpr bool elementwise = true;  // chunks may be updated in parallel

  template <class T>
  void update(std::span<const T> grad, std::span<T> weight, const slots_view<T>&) const {
    const std::size_t n = weight.size();
    T* __restrict w = weight.data();
    const T* __restrict g = grad.data();
    for (std::size_t i = 0; i < n; ++i) w[i] += g[i];
  }

  template <class Ar>
  void serialize(Ar&, unsigned /*version*/) {}
};

}  // namespace kvstore::optim
