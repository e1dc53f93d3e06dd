// Learning-rate schedules (optim/schedule.hpp) against MXNet 1.9's schedulers, written out here
// as python/mxnet/lr_scheduler.py runs them: stateful objects called once per update with the
// update count. Then the schedules inside sgd, adam and adagrad on a local store, t counted per
// key, the refusals at set_optimizer, and the parameters' round trip.
#include <kvstore/optim/schedule.hpp>  // first: the header is self-contained

#include <kvstore/local.hpp>

#include <doctest/doctest.h>

#include "support/helpers.hpp"

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

namespace optim = kvstore::optim;
using kvtest::error_of;

namespace {

// MXNet's LRScheduler warm-up (warmup_mode "linear").
struct mx_warmup {
  double base;
  std::int64_t warmup_steps;
  double warmup_begin_lr;
  double warm(std::int64_t n) const {
    return warmup_begin_lr +
           (base - warmup_begin_lr) * static_cast<double>(n) / static_cast<double>(warmup_steps);
  }
};

// FactorScheduler.__call__: base_lr mutated as updates pass.
struct mx_factor : mx_warmup {
  std::int64_t step;
  double factor, stop_factor_lr;
  double lr = base;
  std::int64_t count = 0;
  double operator()(std::int64_t n) {
    if (n < warmup_steps) return warm(n);
    while (n > count + step) {
      count += step;
      lr *= factor;
      if (lr < stop_factor_lr) lr = stop_factor_lr;
    }
    return lr;
  }
};

// MultiFactorScheduler.__call__.
struct mx_multifactor : mx_warmup {
  std::vector<std::int64_t> steps;
  double factor;
  double lr = base;
  std::size_t cur = 0;
  double operator()(std::int64_t n) {
    if (n < warmup_steps) return warm(n);
    while (cur < steps.size()) {
      if (n > steps[cur]) {
        ++cur;
        lr *= factor;
      } else {
        return lr;
      }
    }
    return lr;
  }
};

// PolyScheduler.__call__ (and CosineScheduler's with `cosine`).
struct mx_poly : mx_warmup {
  std::int64_t max_update;
  double power, final_lr;
  bool cosine = false;
  double lr = base;
  double operator()(std::int64_t n) {
    if (n < warmup_steps) return warm(n);
    const double max_steps = static_cast<double>(max_update - warmup_steps);
    if (n <= max_update) {
      const double done = static_cast<double>(n - warmup_steps) / max_steps;
      lr = cosine ? final_lr + (base - final_lr) * (1 + std::cos(std::numbers::pi * done)) / 2
                  : final_lr + (base - final_lr) * std::pow(1.0 - done, power);
    }
    return lr;
  }
};

}  // namespace

TEST_CASE("each schedule gives MXNet's rate at every update, warm-up included") {
  const double base = 0.1;
  SUBCASE("factor") {
    optim::lr_schedule s = optim::factor_schedule{.step = 7, .factor = 0.5, .stop_factor_lr = 1e-4};
    mx_factor mx{{base, 0, 0}, 7, 0.5, 1e-4};
    for (std::int64_t t = 1; t <= 200; ++t) REQUIRE(s.rate(base, t) == mx(t));
    CHECK(s.rate(base, 7) == base);
    CHECK(s.rate(base, 8) == base * 0.5);
    CHECK(s.rate(base, 200) == 1e-4);  // the floor
  }
  SUBCASE("factor with warm-up") {
    optim::lr_schedule s = optim::factor_schedule{
        .step = 10, .factor = 0.9, .warmup_steps = 5, .warmup_begin_lr = 0.01};
    mx_factor mx{{base, 5, 0.01}, 10, 0.9, 1e-8};
    for (std::int64_t t = 1; t <= 100; ++t) REQUIRE(s.rate(base, t) == mx(t));
    CHECK(s.rate(base, 1) == doctest::Approx(0.01 + 0.09 / 5));
  }
  SUBCASE("factor past the loop's bound falls to its floor") {
    optim::lr_schedule s = optim::factor_schedule{.step = 1, .factor = 0.999};
    CHECK(s.rate(base, 1'000'000'000) == 1e-8);
    CHECK(s.rate(base, 3000) == doctest::Approx(base * std::pow(0.999, 2999)));
  }
  SUBCASE("multifactor") {
    optim::lr_schedule s = optim::multifactor_schedule{.steps = {3, 10, 11, 40}, .factor = 0.25};
    mx_multifactor mx{{base, 0, 0}, {3, 10, 11, 40}, 0.25};
    for (std::int64_t t = 1; t <= 60; ++t) REQUIRE(s.rate(base, t) == mx(t));
    CHECK(s.rate(base, 3) == base);
    CHECK(s.rate(base, 4) == base * 0.25);
    CHECK(s.rate(base, 12) == base * 0.25 * 0.25 * 0.25);
  }
  SUBCASE("poly") {
    optim::lr_schedule s = optim::poly_schedule{
        .max_update = 50, .power = 2, .final_lr = 0.001, .warmup_steps = 4, .warmup_begin_lr = 0};
    mx_poly mx{{base, 4, 0}, 50, 2, 0.001};
    for (std::int64_t t = 1; t <= 80; ++t) REQUIRE(s.rate(base, t) == mx(t));
    CHECK(s.rate(base, 50) == doctest::Approx(0.001));
    CHECK(s.rate(base, 51) == 0.001);
  }
  SUBCASE("cosine") {
    optim::lr_schedule s = optim::cosine_schedule{.max_update = 30, .final_lr = 0.0};
    mx_poly mx{{base, 0, 0}, 30, 0, 0.0, true};
    for (std::int64_t t = 1; t <= 45; ++t) REQUIRE(s.rate(base, t) == mx(t));
    CHECK(s.rate(base, 15) == doctest::Approx(base / 2));
    CHECK(s.rate(base, 31) == 0.0);
  }
  SUBCASE("none") {
    optim::lr_schedule s;
    CHECK(s.empty());
    CHECK(s.rate(base, 12345) == base);
  }
}

namespace {

// SINGA's generators as src/utils/updater.cc writes them (its step s: 0 for the first update;
// its parameters are floats).
float singa_linear(float base, float final_lr, int freq, int step) {
  float r = step * 1.0 / freq;
  return (1.0 - r) * base + r * final_lr;
}
float singa_exp(float base, int freq, int step) { return base / std::pow(2, step * 1. / freq); }
float singa_inv(float base, float gamma, float pow, int step) {
  return base * std::pow(1.f + gamma * step, -pow);
}
float singa_inv_t(float base, float final_lr, int step) {
  return base / (1 + step * 1. / final_lr);
}
float singa_step_gen(float base, float gamma, int freq, int step) {
  return base * std::pow(gamma, step / freq);
}

}  // namespace

TEST_CASE("SINGA's generators: its rate at step t - 1, computed in float as SINGA does") {
  const float base = 0.1f;
  const optim::lr_schedule lin = optim::linear_schedule{.change_freq = 20, .final_lr = 0.001};
  const optim::lr_schedule ex = optim::exponential_schedule{.change_freq = 7};
  const optim::lr_schedule inv = optim::inverse_schedule{.gamma = 0.01, .pow = 0.75};
  const optim::lr_schedule inv_t = optim::inverse_t_schedule{.final_lr = 0.05};
  for (int t = 1; t <= 100; ++t) {
    CAPTURE(t);
    REQUIRE(lin.rate(0.1, t) == singa_linear(base, 0.001f, 20, t - 1));
    REQUIRE(ex.rate(0.1, t) == singa_exp(base, 7, t - 1));
    REQUIRE(inv.rate(0.1, t) == singa_inv(base, 0.01f, 0.75f, t - 1));
    REQUIRE(inv_t.rate(0.1, t) == singa_inv_t(base, 0.05f, t - 1));
    // SINGA's step generator is factor_schedule with no floor.
    const optim::lr_schedule step =
        optim::factor_schedule{.step = 10, .factor = 0.5, .stop_factor_lr = 0};
    REQUIRE(static_cast<float>(step.rate(0.1, t)) ==
            doctest::Approx(singa_step_gen(base, 0.5f, 10, t - 1)).epsilon(1e-6));
  }
  CHECK(lin.rate(0.1, 1) == base);  // step 0: the base rate
  CHECK(ex.rate(0.1, 8) == doctest::Approx(0.05));
  // A bad field is refused, naming it.
  for (const auto& [s, says] : std::vector<std::pair<optim::lr_schedule, std::string>>{
           {optim::linear_schedule{}, "linear_schedule: change_freq must be in [1, 2^31)"},
           {optim::exponential_schedule{.change_freq = -3}, "exponential_schedule: change_freq"},
           {optim::inverse_schedule{.gamma = -1}, "inverse_schedule: gamma must be >= 0"},
           {optim::inverse_t_schedule{}, "inverse_t_schedule: final_lr must be > 0"}}) {
    auto e = error_of([&] { s.check(); });
    REQUIRE(e);
    CHECK(std::string(e->what()).find(says) != std::string::npos);
  }
}

TEST_CASE("a local store applies a SINGA schedule; the parameters round-trip") {
  kvstore::KVStore<kvstore::local> kv;
  std::vector<float> w(2, 1.0f), g(2, 1.0f), out(2);
  kv.init(0, w);
  const optim::sgd o{.learning_rate = 0.1,
                     .schedule = optim::linear_schedule{.change_freq = 4, .final_lr = 0.02}};
  kv.set_optimizer(o);
  float expect = 1.0f;
  for (int t = 1; t <= 6; ++t) {
    kv.push(0, g);
    expect -= singa_linear(0.1f, 0.02f, 4, t - 1) * 1.0f;
  }
  kv.pull(0, out).wait();
  CHECK(out[0] == expect);
  const auto back =
      kvstore::detail::deserialize_params<optim::sgd>("sgd", optim::serialize_params(o));
  for (std::uint64_t t = 1; t <= 10; ++t)
    REQUIRE(back.schedule.rate(0.1, t) == o.schedule.rate(0.1, t));
}

namespace {

// w after `updates` pushes of g = 1 to one key, in float as the store computes: lr_t rounded to
// float, then w -= lr_t * g.
float sgd_reference(float w, int updates, mx_factor mx) {
  for (int t = 1; t <= updates; ++t) w -= static_cast<float>(mx(t)) * 1.0f;
  return w;
}

}  // namespace

TEST_CASE("a local store applies sgd's schedule at each key's own update count") {
  kvstore::KVStore<kvstore::local> kv;
  std::vector<float> a(3, 1.0f), b(3, 1.0f), g(3, 1.0f), out(3);
  kv.init("a", a);
  kv.init("b", b);
  kv.set_optimizer(optim::sgd{.learning_rate = 0.1,
                              .schedule = optim::factor_schedule{.step = 2, .factor = 0.5}});
  for (int i = 0; i < 7; ++i) kv.push("a", g);
  for (int i = 0; i < 2; ++i) kv.push("b", g);
  kv.pull("a", out).wait();
  // a: t = 1..7, b: t = 1..2 (its count is its own, not the store's).
  CHECK(out[0] == sgd_reference(1.0f, 7, mx_factor{{0.1, 0, 0}, 2, 0.5, 1e-8}));
  kv.pull("b", out).wait();
  CHECK(out[0] == sgd_reference(1.0f, 2, mx_factor{{0.1, 0, 0}, 2, 0.5, 1e-8}));
  CHECK(out[2] == out[0]);
}

TEST_CASE("adam and adagrad start each update from the schedule's rate") {
  const double base = 0.05;
  optim::lr_schedule sched = optim::multifactor_schedule{.steps = {2, 4}, .factor = 0.1};
  SUBCASE("adam: lr_t = rate(t) * sqrt(1 - beta2^t) / (1 - beta1^t)") {
    kvstore::KVStore<kvstore::local> kv;
    std::vector<float> w(2, 0.5f), g(2, 0.25f), out(2);
    kv.init(0, w);
    kv.set_optimizer(optim::adam{.learning_rate = base, .schedule = sched});
    float ew = 0.5f, m = 0, v = 0;
    for (int t = 1; t <= 6; ++t) {
      kv.push(0, g);
      const auto lr = static_cast<float>(sched.rate(base, t) * std::sqrt(1 - std::pow(0.999, t)) /
                                         (1 - std::pow(0.9, t)));
      m = 0.9f * m + 0.1f * 0.25f;
      v = 0.999f * v + 0.001f * 0.25f * 0.25f;
      ew -= lr * m / (std::sqrt(v) + 1e-8f);
    }
    kv.pull(0, out).wait();
    CHECK(out[0] == doctest::Approx(ew).epsilon(1e-6));
  }
  SUBCASE("adagrad") {
    kvstore::KVStore<kvstore::local> kv;
    std::vector<float> w(2, 0.5f), g(2, 0.25f), out(2);
    kv.init(0, w);
    kv.set_optimizer(optim::adagrad{.learning_rate = base, .schedule = sched});
    float ew = 0.5f, h = 0;
    for (int t = 1; t <= 6; ++t) {
      kv.push(0, g);
      const auto lr = static_cast<float>(sched.rate(base, t));
      h += 0.25f * 0.25f;
      ew -= lr * (0.25f / (std::sqrt(h) + 1e-7f) + 0.0f * ew);
    }
    kv.pull(0, out).wait();
    CHECK(out[0] == doctest::Approx(ew).epsilon(1e-6));
    // Without the schedule the rate would have stayed 0.05: the result differs.
    float flat = 0.5f, h2 = 0;
    for (int t = 1; t <= 6; ++t) {
      h2 += 0.25f * 0.25f;
      flat -= 0.05f * (0.25f / (std::sqrt(h2) + 1e-7f));
    }
    CHECK(out[0] != doctest::Approx(flat).epsilon(1e-6));
  }
}

TEST_CASE("a schedule with a bad field is refused at set_optimizer, naming it") {
  kvstore::KVStore<kvstore::local> kv;
  std::vector<float> w(2, 1.0f), out(2);
  kv.init(1, w);
  const auto refused = [&](auto o, const std::string& says) {
    auto e = error_of([&] { kv.set_optimizer(o); });
    REQUIRE(e);
    CHECK(e->code() == kvstore::errc::invalid_argument);
    CHECK_MESSAGE(std::string(e->what()).find(says) != std::string::npos, e->what());
  };
  refused(optim::sgd{.schedule = optim::factor_schedule{.step = 0}},
          "factor_schedule: step must be >= 1");
  refused(optim::sgd{.schedule = optim::factor_schedule{.step = 3, .factor = 1.5}},
          "factor must be in [0, 1]");
  refused(optim::adam{.schedule = optim::multifactor_schedule{.steps = {5, 5}}},
          "steps must be increasing");
  refused(optim::adam{.schedule = optim::multifactor_schedule{}}, "steps is empty");
  refused(optim::adagrad{.schedule = optim::poly_schedule{.max_update = 0}},
          "max_update must be >= 1");
  refused(optim::sgd{.schedule = optim::cosine_schedule{.max_update = 5, .warmup_steps = 5}},
          "max_update must be > warmup_steps");
  // The error names the optimizer too, and the store is untouched: no optimizer, so a push
  // still replaces the value.
  auto e = error_of([&] { kv.set_optimizer(optim::adagrad{.schedule = optim::poly_schedule{}}); });
  REQUIRE(e);
  CHECK(std::string(e->what()).rfind("adagrad: poly_schedule", 0) == 0);
  std::vector<float> g(2, 3.0f);
  kv.push(1, g);
  kv.pull(1, out).wait();
  CHECK(out[0] == 3.0f);
}

TEST_CASE("a schedule travels with its optimizer's parameters") {
  const optim::sgd o{
      .learning_rate = 0.2,
      .momentum = 0.9,
      .schedule = optim::multifactor_schedule{
          .steps = {10, 20, 30}, .factor = 0.5, .warmup_steps = 3, .warmup_begin_lr = 0.01}};
  const std::string text = optim::serialize_params(o);
  const auto back = kvstore::detail::deserialize_params<optim::sgd>("sgd", text);
  CHECK(back.momentum == 0.9);
  for (std::uint64_t t = 1; t <= 40; ++t)
    REQUIRE(back.schedule.rate(0.2, t) == o.schedule.rate(0.2, t));
  // A peer's text with a bad schedule is refused where it is rebuilt, as a bad argument.
  auto no_kind = optim::serialize_params(optim::sgd{});  // ends with the schedule's kind, 0
  no_kind.replace(no_kind.rfind('0'), 1, "9");           // the schedule's kind: no such schedule
  auto e = error_of([&] { kvstore::detail::deserialize_params<optim::sgd>("sgd", no_kind); });
  REQUIRE(e);
  CHECK(e->code() == kvstore::errc::invalid_argument);
  CHECK(std::string(e->what()).find("unknown schedule kind 9") != std::string::npos);
}
