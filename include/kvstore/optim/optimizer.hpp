// The optimizer interface every store uses: per-key state, the view an update sees, the
// concept a registered optimizer type meets, and the type-erased updater a store holds.
#pragma once

#include <kvstore/key.hpp>
#include <kvstore/optim/slots.hpp>

#include <array>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::optim {

/// Per-key optimizer state, created lazily on a key's first update: the number of updates applied
/// so far and `num_slots` arrays of the key's size (momentum, moments, sums of squares...).
template <class T>
struct state {
  std::uint64_t step = 0;
  std::vector<std::vector<T>> slots;
};

/// What one update call sees: the slots restricted to the elements being updated (the whole key,
/// one slice of it on a server, or some rows), the step number of this update (1 for the first
/// update of the key), and the key's multipliers of the learning rate and weight decay
/// (set_key_options: MXNet's lr_mult and wd_mult). The built-in optimizers scale by them; a
/// registered optimizer of your own should too.
template <class T>
struct slots_view {
  std::array<std::span<T>, max_slots> slot{};
  std::uint64_t step = 1;
  double lr_mult = 1;
  double wd_mult = 1;
};

/// A key's multipliers, as its updates see them (slots_view).
struct multipliers {
  double lr = 1;
  double wd = 1;
};

/// Whether optimizer type O says its update is element-wise (`static constexpr bool
/// elementwise = true;`, as sgd, adam, adagrad and add do): see updater::elementwise.
template <class O>
inline constexpr bool is_elementwise = [] {
  if constexpr (requires { O::elementwise; })
    return static_cast<bool>(O::elementwise);
  else
    return false;
}();

/// A registered optimizer type: an aggregate of parameters with
///   static constexpr std::string_view name;    // unique, what travels to servers
///   static constexpr int num_slots;            // 0..max_slots
///   template <class T> void update(std::span<const T> grad, std::span<T> weight,
///                                  const slots_view<T>& s) const;
///   template <class Ar> void serialize(Ar& ar, unsigned version);  // its parameters
template <class O>
concept registered_optimizer = requires(const O& o, std::span<const float> g, std::span<float> w,
                                        const slots_view<float>& s) {
  { O::name } -> std::convertible_to<std::string_view>;
  { O::num_slots } -> std::convertible_to<int>;
  o.update(g, w, s);
};

/// A user callable: (key, grad, weight), local mode only.
template <class F, class T>
concept callable_optimizer = std::invocable<F&, const key&, std::span<const T>, std::span<T>>;

/// The type-erased optimizer a store holds. `name`/`params` identify a registered optimizer and
/// its serialized parameters (empty name for a plain callable, which cannot leave the process).
template <class T>
struct updater {
  using fn_type = std::function<void(const key&, std::span<const T> grad, std::span<T> weight,
                                     const slots_view<T>& s)>;
  std::string name;
  std::string params;
  int num_slots = 0;
  /// Each element's update reads only that element's gradient, weight and slots (and the
  /// step): a key may then be updated in chunks, in parallel, with the same result (a server
  /// does so for large values). From the optimizer type's `static constexpr bool elementwise`.
  bool elementwise = false;
  fn_type fn;

  explicit operator bool() const noexcept { return static_cast<bool>(fn); }

  /// Applies one update of the whole key (grad and weight the same size) with its state, which is
  /// sized on first use. Increments the step count.
  void apply(const key& k, std::span<const T> grad, std::span<T> weight, state<T>& st,
             multipliers m = {}) const {
    ensure_state(st, weight.size());
    ++st.step;
    fn(k, grad, weight, view(st, 0, weight.size(), m));
  }

  /// Sizes the state for a key of n elements (no-op once sized).
  void ensure_state(state<T>& st, std::size_t n) const {
    if (st.slots.size() != static_cast<std::size_t>(num_slots)) {
      st.slots.assign(static_cast<std::size_t>(num_slots), std::vector<T>(n, T{}));
    }
  }

  /// The slots of elements [offset, offset + n), at the current step, with the key's multipliers.
  static slots_view<T> view(state<T>& st, std::size_t offset, std::size_t n, multipliers m = {}) {
    slots_view<T> v;
    v.step = st.step;
    v.lr_mult = m.lr;
    v.wd_mult = m.wd;
    for (std::size_t i = 0; i < st.slots.size() && i < max_slots; ++i)
      v.slot[i] = std::span<T>(st.slots[i]).subspan(offset, n);
    return v;
  }
};

/// Wraps a user callable (local mode).
template <class T, class F>
requires callable_optimizer<F, T> updater<T> from_callable(F f) {
  updater<T> u;
  u.fn = [f = std::move(f)](const key& k, std::span<const T> g, std::span<T> w,
                            const slots_view<T>&) mutable { f(k, g, w); };
  return u;
}

}  // namespace kvstore::optim
