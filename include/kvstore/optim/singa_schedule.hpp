// SINGA's learning-rate generators (src/utils/updater.cc, LinearLRGen, ExpLRGen, InvLRGen,
// InvTLRGen) as schedules of optim/schedule.hpp. SINGA numbers steps from 0, so its step s is
// kvstore's update t = s + 1, and it computes in float: each rate here is SINGA's expression in
// SINGA's types, then widened. SINGA's fixed rate is no schedule; its step generator is
// factor_schedule{.step = change_freq, .factor = gamma, .stop_factor_lr = 0}.
#pragma once

#include <kvstore/error.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace kvstore::detail {
[[noreturn]] inline void bad_schedule(const char* schedule, const std::string& why) {
  throw error(errc::invalid_argument, std::string(schedule) + ": " + why);
}
inline void check_freq(const char* schedule, std::int64_t change_freq) {
  if (change_freq < 1 || change_freq > INT32_MAX)
    bad_schedule(schedule, "change_freq must be in [1, 2^31), got " + std::to_string(change_freq));
}
// SINGA's step (0 for the first update) as the int it is there (its steps stop at 2^31 - 1).
inline int singa_step(double t) {
  return t > static_cast<double>(INT32_MAX) ? INT32_MAX - 1 : static_cast<int>(t) - 1;
}
}  // namespace kvstore::detail

namespace kvstore::optim {

/// SINGA's LinearLRGen: r = s / change_freq, lr = (1 - r) base + r final_lr.
struct linear_schedule {
  std::int64_t change_freq = 0;  // required, >= 1
  double final_lr = 0;

  double rate(double base, double t) const {
    const int freq = static_cast<int>(change_freq);
    const float r = static_cast<float>(detail::singa_step(t) * 1.0 / freq);
    return static_cast<float>((1.0 - r) * static_cast<float>(base) +
                              r * static_cast<float>(final_lr));
  }
  void check() const { detail::check_freq("linear_schedule", change_freq); }
  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& change_freq& final_lr;
  }
};

/// SINGA's ExpLRGen: lr = base / 2^(s / change_freq), halved every change_freq steps, smoothly.
struct exponential_schedule {
  std::int64_t change_freq = 0;  // required, >= 1

  double rate(double base, double t) const {
    const int freq = static_cast<int>(change_freq);
    return static_cast<float>(static_cast<float>(base) /
                              std::pow(2, detail::singa_step(t) * 1. / freq));
  }
  void check() const { detail::check_freq("exponential_schedule", change_freq); }
  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& change_freq;
  }
};

/// SINGA's InvLRGen: lr = base (1 + gamma s)^(-pow).
struct inverse_schedule {
  double gamma = 0;
  double pow = 1;

  double rate(double base, double t) const {
    const float g = static_cast<float>(gamma), p = static_cast<float>(pow);
    const float s = static_cast<float>(detail::singa_step(t));
    return static_cast<float>(static_cast<float>(base) * std::pow(1.f + g * s, -p));
  }
  void check() const {
    if (!(gamma >= 0))
      detail::bad_schedule("inverse_schedule", "gamma must be >= 0, got " + std::to_string(gamma));
  }
  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& gamma& pow;
  }
};

/// SINGA's InvTLRGen: lr = base / (1 + s / final_lr) (SINGA's convention: final_lr = base / 2).
struct inverse_t_schedule {
  double final_lr = 0;  // required, > 0

  double rate(double base, double t) const {
    return static_cast<float>(static_cast<float>(base) /
                              (1 + detail::singa_step(t) * 1. / static_cast<float>(final_lr)));
  }
  void check() const {
    if (!(static_cast<float>(final_lr) > 0))
      detail::bad_schedule("inverse_t_schedule",
                           "final_lr must be > 0 (it divides), got " + std::to_string(final_lr));
  }
  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& final_lr;
  }
};

}  // namespace kvstore::optim
