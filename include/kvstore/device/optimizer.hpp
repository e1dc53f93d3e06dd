// The device store's optimizer: sgd, adam and adagrad are applied inside the push kernel (their
// parameters read once from the registered updater); any other one is applied on host copies.
// Also a key's optimizer state on its owner device, made ready for an update.
#pragma once

#include <kvstore/device/key_state.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/reduce/thrust.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace kvstore::detail {

/// The store's optimizer: fused on the device for sgd/adam/adagrad, else applied on host copies.
template <class T>
struct device_optimizer {
  optim::updater<T> u;
  std::uint64_t gen = 0;  ///< tells the states of an older optimizer apart
  bool fused = false;
  reduce::device_update<T> base;  ///< kind (each update's step is made from the parameters)
  optim::sgd sgd{};
  optim::adam adam{};
  optim::adagrad adagrad{};
};

/// The device form of `u` (generation `gen`): fused when its name is sgd, adam or adagrad.
template <class T>
std::shared_ptr<const device_optimizer<T>> make_device_optimizer(optim::updater<T> u,
                                                                 std::uint64_t gen) {
  auto o = std::make_shared<device_optimizer<T>>();
  using U = reduce::device_update<T>;
  if (u.name == optim::sgd::name) {
    o->sgd = deserialize_params<optim::sgd>(u.name, u.params);
    o->fused = true;
    o->base.kind = U::sgd;
  } else if (u.name == optim::adam::name) {
    o->fused = true;
    o->adam = deserialize_params<optim::adam>(u.name, u.params);
    o->base.kind = U::adam;
  } else if (u.name == optim::adagrad::name) {
    o->adagrad = deserialize_params<optim::adagrad>(u.name, u.params);
    o->fused = true;
    o->base.kind = U::adagrad;
  }
  o->u = std::move(u);
  o->gen = gen;
  return o;
}

/// e's state for optimizer o, on the owner: fresh (zeroed on stream s) when it belonged to
/// another optimizer or has not been made yet.
template <class T>
void ensure_state(device_entry<T>& e, const device_optimizer<T>& o, rt::stream_t s) {
  if (e.state_gen != o.gen) {
    e.slots.clear();
    e.step = 0;
    e.state_gen = o.gen;
  }
  if (e.slots.size() != static_cast<std::size_t>(o.u.num_slots)) {
    e.slots.clear();
    for (int i = 0; i < o.u.num_slots; ++i) {
      e.slots.emplace_back(e.size, e.owner);
      rt::memset_async(e.slots.back().data(), e.size * sizeof(T), s);
    }
  }
}

/// The update a push applies, in `u` with the state arrays it uses in s0 and s1: a store (no
/// optimizer), or a fused optimizer whose state is made ready and whose step advances. Returns
/// false for an optimizer applied on the host (state made ready, step not advanced).
template <class T>
bool prepare_update(device_entry<T>& e, const device_optimizer<T>* opt, rt::stream_t s,
                    reduce::device_update<T>& u, T*& s0, T*& s1) {
  s0 = s1 = nullptr;
  if (!opt) return true;
  ensure_state(e, *opt, s);
  if (!opt->fused) return false;
  ++e.step;
  u = opt->base;
  // The step of this key's update: its multipliers (set_key_options) scale learning rate and
  // weight decay; schedules and adam's bias correction follow its step count.
  using U = reduce::device_update<T>;
  const auto [lr, wd] = e.mult;
  if (u.kind == U::sgd) u.sgd_st = opt->sgd.template step<T>(lr, wd, e.step);
  if (u.kind == U::adagrad) u.adagrad_st = opt->adagrad.template step<T>(lr, wd, e.step);
  if (u.kind == U::adam) u.adam_st = opt->adam.template step_at<T>(e.step, lr, wd);
  const int used = u.slots();
  if (used > 0) s0 = e.slots[0].data();
  if (used > 1) s1 = e.slots[1].data();
  return true;
}

}  // namespace kvstore::detail
