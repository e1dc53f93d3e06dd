// Learning-rate schedules: the rate sgd, adam and adagrad use at a key's update t (1 for its
// first), with MXNet 1.9's formulas (python/mxnet/lr_scheduler.py) and SINGA's generators
// (optim/singa_schedule.hpp), applied wherever the optimizer runs. A schedule is part of its
// optimizer's parameters: it travels to the servers with them, and t is the key's step count, which
// optimizer state and snapshots keep.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/optim/singa_schedule.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace kvstore::optim {

/// No schedule: the optimizer's learning_rate at every update.
struct no_schedule {
  template <class Ar>
  void serialize(Ar&, unsigned) {}
};

/// MXNet's FactorScheduler: lr = max(base * factor^floor((t - 1) / step), stop_factor_lr).
struct factor_schedule {
  std::int64_t step = 0;  // required: updates between two reductions (>= 1)
  double factor = 1;      // in [0, 1]
  double stop_factor_lr = 1e-8;
  std::int64_t warmup_steps = 0;
  double warmup_begin_lr = 0;

  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& step& factor& stop_factor_lr& warmup_steps& warmup_begin_lr;
  }
};

/// MXNet's MultiFactorScheduler: lr = base * factor^(number of steps s with t > s).
struct multifactor_schedule {
  std::vector<std::int64_t> steps;  // strictly increasing, each >= 1
  double factor = 1;                // in [0, 1]
  std::int64_t warmup_steps = 0;
  double warmup_begin_lr = 0;

  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    std::size_t n = steps.size();
    ar& n;
    if constexpr (Ar::is_loading::value) {
      // A peer's parameters: bounded before anything is allocated.
      if (n > max_steps)
        throw error(errc::invalid_argument, "multifactor_schedule: too many steps");
      steps.resize(n);
    }
    for (auto& s : steps) ar& s;
    ar& factor& warmup_steps& warmup_begin_lr;
  }
  static constexpr std::size_t max_steps = std::size_t{1} << 16;
};

/// MXNet's PolyScheduler: lr = final + (base - final) (1 - t'/m)^power while t <= max_update,
/// then final_lr; t' = t - warmup_steps, m = max_update - warmup_steps.
struct poly_schedule {
  std::int64_t max_update = 0;  // required: > warmup_steps
  double power = 2;
  double final_lr = 0;
  std::int64_t warmup_steps = 0;
  double warmup_begin_lr = 0;

  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& max_update& power& final_lr& warmup_steps& warmup_begin_lr;
  }
};

/// MXNet's CosineScheduler: lr = final + (base - final) (1 + cos(pi t'/m)) / 2 while
/// t <= max_update, then final_lr; t' and m as for poly_schedule.
struct cosine_schedule {
  std::int64_t max_update = 0;  // required: > warmup_steps
  double final_lr = 0;
  std::int64_t warmup_steps = 0;
  double warmup_begin_lr = 0;

  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& max_update& final_lr& warmup_steps& warmup_begin_lr;
  }
};

/// The `schedule` field of sgd, adam and adagrad: one of the schedules above or SINGA's
/// (default: none). Its serialized form is the alternative's index, then its fields: new kinds
/// go at the end.
class lr_schedule {
 public:
  using alternatives = std::variant<no_schedule, factor_schedule, multifactor_schedule,
                                    poly_schedule, cosine_schedule, linear_schedule,
                                    exponential_schedule, inverse_schedule, inverse_t_schedule>;

  lr_schedule() = default;
  template <class S>
  requires std::is_constructible_v<alternatives, S> lr_schedule(S s) : v_(std::move(s)) {}

  const alternatives& get() const noexcept { return v_; }
  bool empty() const noexcept { return std::holds_alternative<no_schedule>(v_); }

  /// The rate at update t (1 for a key's first; 0 counts as 1) of an optimizer whose
  /// learning_rate is `base`.
  double rate(double base, std::uint64_t t) const {
    const double n = static_cast<double>(t == 0 ? 1 : t);
    return std::visit([&](const auto& s) { return rate_of(s, base, n); }, v_);
  }

  /// Throws kvstore::error(invalid_argument) naming the first bad field.
  void check() const {
    std::visit([](const auto& s) { check_of(s); }, v_);
  }

  template <class Ar>
  void serialize(Ar& ar, unsigned version) {
    int kind = static_cast<int>(v_.index());
    ar& kind;
    if constexpr (Ar::is_loading::value)
      emplace_kind(kind, std::make_index_sequence<std::variant_size_v<alternatives>>{});
    std::visit([&](auto& s) { s.serialize(ar, version); }, v_);
  }

 private:
  alternatives v_;
  static constexpr double max_products = 4096;

  template <std::size_t... I>
  void emplace_kind(int kind, std::index_sequence<I...>) {
    const bool known =
        ((kind == static_cast<int>(I) ? (v_.template emplace<I>(), true) : false) || ...);
    if (!known)
      throw error(errc::invalid_argument, "unknown schedule kind " + std::to_string(kind));
  }

  // MXNet's linear warm-up (LRScheduler.get_warmup_lr), for t < warmup_steps.
  template <class S>
  static bool warming(const S& s, double base, double t, double& lr) {
    if (t >= static_cast<double>(s.warmup_steps)) return false;
    lr = s.warmup_begin_lr + (base - s.warmup_begin_lr) * t / static_cast<double>(s.warmup_steps);
    return true;
  }

  static double rate_of(const no_schedule&, double base, double) { return base; }
  template <class S>
  requires requires(const S& s) { s.rate(1.0, 1.0); }
  static double rate_of(const S& s, double base, double t) { return s.rate(base, t); }
  static double rate_of(const factor_schedule& s, double base, double t) {
    double lr;
    if (warming(s, base, t, lr)) return lr;
    // MXNet multiplies once per step passed, clamping as it goes: the same products here, up
    // to a bound on the loop (beyond it, one pow: the rate has long reached its floor).
    const double passed = std::floor((t - 1) / static_cast<double>(s.step));
    if (s.factor == 1 || passed < 1) return base;
    if (passed > max_products) return std::max(base * std::pow(s.factor, passed), s.stop_factor_lr);
    lr = base;
    for (double i = 0; i < passed; ++i) {
      lr *= s.factor;
      if (lr < s.stop_factor_lr) return s.stop_factor_lr;
    }
    return lr;
  }
  static double rate_of(const multifactor_schedule& s, double base, double t) {
    double lr;
    if (warming(s, base, t, lr)) return lr;
    lr = base;
    for (std::int64_t step : s.steps) {
      if (!(t > static_cast<double>(step))) break;
      lr *= s.factor;
    }
    return lr;
  }
  static double rate_of(const poly_schedule& s, double base, double t) {
    double lr;
    if (warming(s, base, t, lr)) return lr;
    if (t > static_cast<double>(s.max_update)) return s.final_lr;
    const double m = static_cast<double>(s.max_update - s.warmup_steps);
    const double done = (t - static_cast<double>(s.warmup_steps)) / m;
    return s.final_lr + (base - s.final_lr) * std::pow(1.0 - done, s.power);
  }
  static double rate_of(const cosine_schedule& s, double base, double t) {
    double lr;
    if (warming(s, base, t, lr)) return lr;
    if (t > static_cast<double>(s.max_update)) return s.final_lr;
    const double m = static_cast<double>(s.max_update - s.warmup_steps);
    const double done = (t - static_cast<double>(s.warmup_steps)) / m;
    return s.final_lr + (base - s.final_lr) * (1 + std::cos(std::numbers::pi * done)) / 2;
  }

  template <class S>
  static void check_warmup(const char* name, const S& s) {
    if (s.warmup_steps < 0) detail::bad_schedule(name, "warmup_steps must be >= 0");
  }
  static void check_of(const no_schedule&) {}
  template <class S>
  requires requires(const S& s) { s.check(); }
  static void check_of(const S& s) { s.check(); }
  static void check_of(const factor_schedule& s) {
    if (s.step < 1)
      detail::bad_schedule("factor_schedule", "step must be >= 1, got " + std::to_string(s.step));
    if (!(s.factor >= 0 && s.factor <= 1))
      detail::bad_schedule(
          "factor_schedule",
          "factor must be in [0, 1] (the rate only falls), got " + std::to_string(s.factor));
    check_warmup("factor_schedule", s);
  }
  static void check_of(const multifactor_schedule& s) {
    if (s.steps.empty()) detail::bad_schedule("multifactor_schedule", "steps is empty");
    for (std::size_t i = 0; i < s.steps.size(); ++i) {
      if (s.steps[i] < 1) detail::bad_schedule("multifactor_schedule", "steps must be >= 1");
      if (i > 0 && s.steps[i] <= s.steps[i - 1])
        detail::bad_schedule("multifactor_schedule", "steps must be increasing, got " +
                                                         std::to_string(s.steps[i - 1]) + " then " +
                                                         std::to_string(s.steps[i]));
    }
    if (!(s.factor >= 0 && s.factor <= 1))
      detail::bad_schedule("multifactor_schedule",
                           "factor must be in [0, 1], got " + std::to_string(s.factor));
    check_warmup("multifactor_schedule", s);
  }
  template <class S>
  static void check_span(const char* name, const S& s) {
    if (s.max_update < 1)
      detail::bad_schedule(name, "max_update must be >= 1, got " + std::to_string(s.max_update));
    check_warmup(name, s);
    if (s.max_update <= s.warmup_steps)
      detail::bad_schedule(
          name, "max_update must be > warmup_steps (" + std::to_string(s.warmup_steps) + ")");
  }
  static void check_of(const poly_schedule& s) { check_span("poly_schedule", s); }
  static void check_of(const cosine_schedule& s) { check_span("cosine_schedule", s); }
};

}  // namespace kvstore::optim
