#include <kvstore/optim/all.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/helpers.hpp"

using kvtest::error_of;

#include <atomic>
#include <cmath>
#include <cstring>
#include <locale>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace optim = kvstore::optim;

// A user-defined optimizer, registered the way an application would: at namespace scope.
namespace my {
struct signsgd {
  double learning_rate = 0.1;
  static constexpr std::string_view name = "my::signsgd";
  static constexpr int num_slots = 0;
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight, const optim::slots_view<T>&) const {
    const T lr = static_cast<T>(learning_rate);
    for (std::size_t i = 0; i < weight.size(); ++i)
      weight[i] -= lr * static_cast<T>((grad[i] > 0) - (grad[i] < 0));
  }
  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& learning_rate;
  }
};
// Another type claiming a built-in's name: registering it must be refused.
struct fake_sgd : signsgd {
  static constexpr std::string_view name = "sgd";
};
}  // namespace my

KVSTORE_REGISTER_OPTIMIZER(my::signsgd);
KVSTORE_REGISTER_OPTIMIZER(my::signsgd);  // twice is harmless

static_assert(optim::registered_optimizer<optim::sgd>);
static_assert(optim::registered_optimizer<optim::adam>);
static_assert(optim::registered_optimizer<optim::adagrad>);
static_assert(optim::registered_optimizer<my::signsgd>);

namespace {

// Runs `steps` updates of the whole key, with the gradients given per step.
template <class T, class O>
std::vector<T> run(const O& o, std::vector<T> w, const std::vector<std::vector<T>>& grads,
                   optim::state<T>* st_out = nullptr) {
  const auto u = optim::make_updater<T>(o);
  optim::state<T> st;
  for (const auto& g : grads) u.apply(7, g, w, st);
  if (st_out) *st_out = st;
  return w;
}

}  // namespace

TEST_CASE_TEMPLATE("sgd without momentum" * doctest::timeout(60), T, float, double) {
  const optim::sgd o{.learning_rate = 0.5};
  auto w = run<T>(o, {1, -2}, {{0.5, 1}});
  CHECK(w == std::vector<T>{0.75, -2.5});
  w = run<T>(o, {1, -2}, {{0.5, 1}, {0.5, 1}, {-1, 0}});
  CHECK(w == std::vector<T>{1, -3});
}

TEST_CASE_TEMPLATE("sgd with momentum" * doctest::timeout(60), T, float, double) {
  // mom = 0.5 mom - 0.5 g; w += mom, with g = 1: mom -0.5, -0.75, -0.875.
  const optim::sgd o{.learning_rate = 0.5, .momentum = 0.5};
  optim::state<T> st;
  auto w = run<T>(o, {1}, {{1}, {1}, {1}}, &st);
  CHECK(w[0] == T(1 - 0.5 - 0.75 - 0.875));
  CHECK(st.step == 3);
  REQUIRE(st.slots.size() == 1);
  CHECK(st.slots[0][0] == T(-0.875));
}

TEST_CASE_TEMPLATE("sgd weight decay" * doctest::timeout(60), T, float, double) {
  // g' = g + 0.5 w: (1 + 1) then (1 + 0.5).
  const optim::sgd o{.learning_rate = 0.5, .weight_decay = 0.5};
  CHECK(run<T>(o, {2}, {{1}}) == std::vector<T>{1});
  CHECK(run<T>(o, {2}, {{1}, {1}}) == std::vector<T>{0.25});
}

TEST_CASE_TEMPLATE("sgd rescale and clipping" * doctest::timeout(60), T, float, double) {
  // rescale first (2 -> 1), then clip to 0.25.
  const optim::sgd o{.learning_rate = 1, .rescale_grad = 0.5, .clip_gradient = 0.25};
  CHECK(run<T>(o, {0, 0, 0}, {{2, -2, 0.25}}) == std::vector<T>{-0.25, 0.25, -0.125});
  // Clipping comes before weight decay: g = clip(4, 1) + 0.5 * 1 = 1.5.
  const optim::sgd c{.learning_rate = 0.5, .weight_decay = 0.5, .clip_gradient = 1};
  CHECK(run<T>(c, {1}, {{4}}) == std::vector<T>{0.25});
  // clip_gradient <= 0 means off.
  const optim::sgd off{.learning_rate = 1, .clip_gradient = 0};
  CHECK(run<T>(off, {0}, {{100}}) == std::vector<T>{-100});
}

TEST_CASE_TEMPLATE("adam with bias correction, exact steps" * doctest::timeout(60), T, float,
                   double) {
  // beta1 0.5, beta2 0.75, eps 0, lr 1, grads 2, 2, 0:
  //  t=1: m 1,   v 1,    lr_1 = sqrt(0.25)/0.5 = 1            -> w -= 1
  //  t=2: m 1.5, v 1.75, lr_2 = sqrt(0.4375)/0.75             -> w -= lr_2*1.5/sqrt(1.75) = 1
  //  t=3: m .75, v 1.3125, lr_3 = sqrt(1-0.75^3)/(1-0.5^3)    -> w -= lr_3*0.75/sqrt(1.3125)
  const optim::adam o{.learning_rate = 1, .beta1 = 0.5, .beta2 = 0.75, .epsilon = 0};
  const double eps = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  optim::state<T> st;
  auto w = run<T>(o, {10}, {{2}}, &st);
  CHECK(w[0] == doctest::Approx(9).epsilon(eps));
  CHECK(st.slots[0][0] == T(1));
  CHECK(st.slots[1][0] == T(1));
  w = run<T>(o, {10}, {{2}, {2}});
  CHECK(w[0] == doctest::Approx(8).epsilon(eps));
  w = run<T>(o, {10}, {{2}, {2}, {0}}, &st);
  const double lr3 = std::sqrt(1 - 0.421875) / (1 - 0.125);
  CHECK(w[0] == doctest::Approx(8 - lr3 * 0.75 / std::sqrt(1.3125)).epsilon(eps));
  CHECK(st.step == 3);
  CHECK(st.slots[0][0] == T(0.75));
  CHECK(st.slots[1][0] == T(1.3125));
}

TEST_CASE_TEMPLATE("adam first step moves by about lr whatever the gradient's scale" *
                       doctest::timeout(60),
                   T, float, double) {
  // Without bias correction the first step would be lr * 0.1 / sqrt(0.001) ~ 3.16 lr.
  const optim::adam o{.learning_rate = 0.01};
  const auto w = run<T>(o, {1, 1, 1}, {{1000, -3, 1e-3}});
  CHECK(w[0] == doctest::Approx(0.99).epsilon(1e-5));
  CHECK(w[1] == doctest::Approx(1.01).epsilon(1e-5));
  CHECK(w[2] == doctest::Approx(0.99).epsilon(1e-4));
}

TEST_CASE_TEMPLATE("adam weight decay, rescale, clipping" * doctest::timeout(60), T, float,
                   double) {
  // g = clip(0.5 * 8, 1) + 1 * 1 = 2; step 1 with eps 0 moves by lr whatever g.
  const optim::adam o{.learning_rate = 0.5,
                      .beta1 = 0.5,
                      .beta2 = 0.75,
                      .epsilon = 0,
                      .weight_decay = 1,
                      .rescale_grad = 0.5,
                      .clip_gradient = 1};
  optim::state<T> st;
  const auto w = run<T>(o, {1}, {{8}}, &st);
  CHECK(w[0] == doctest::Approx(0.5));
  CHECK(st.slots[0][0] == T(1));  // (1 - 0.5) * 2
  CHECK(st.slots[1][0] == T(1));  // (1 - 0.75) * 4
}

TEST_CASE_TEMPLATE("adagrad" * doctest::timeout(60), T, float, double) {
  // lr 1, eps 0, grads 3 then 4: h 9 -> w -= 1; h 25 -> w -= 0.8.
  const optim::adagrad o{.learning_rate = 1, .epsilon = 0};
  optim::state<T> st;
  const auto w = run<T>(o, {5}, {{3}, {4}}, &st);
  CHECK(w[0] == doctest::Approx(3.2));
  CHECK(st.slots[0][0] == T(25));
  // Weight decay acts on the weight directly, not through the history:
  // h 1, w = 4 - 0.5 (1 + 0.25*4) = 3; then g 0: w = 3 - 0.5 (0 + 0.75) = 2.625.
  const optim::adagrad d{.learning_rate = 0.5, .epsilon = 0, .weight_decay = 0.25};
  CHECK(run<T>(d, {4}, {{1}, {0}}, &st) == std::vector<T>{2.625});
  CHECK(st.slots[0][0] == T(1));
  // Rescale then clip: g = clip(0.5 * 10, 2) = 2, h 4, w -= 2 / 2.
  const optim::adagrad c{.learning_rate = 1, .epsilon = 0, .rescale_grad = 0.5, .clip_gradient = 2};
  CHECK(run<T>(c, {0}, {{10}}) == std::vector<T>{-1});
}

TEST_CASE_TEMPLATE("an update over slices equals the update of the whole key" *
                       doctest::timeout(60),
                   T, float, double) {
  // What a server does with one slice of a key must match the whole-key update bit for bit.
  const auto u = optim::make_updater<T>(optim::adam{.learning_rate = 0.1, .weight_decay = 0.01});
  std::vector<T> g{1, -2, 3, 0.5, -0.25}, whole{1, 2, 3, 4, 5}, sliced = whole;
  optim::state<T> st_whole, st_sliced;
  for (int step = 0; step < 3; ++step) {
    u.apply(1, g, whole, st_whole);
    u.ensure_state(st_sliced, sliced.size());
    ++st_sliced.step;
    const std::span<const T> gs(g);
    const std::span<T> ws(sliced);
    u.fn(1, gs.subspan(0, 2), ws.subspan(0, 2), u.view(st_sliced, 0, 2));
    u.fn(1, gs.subspan(2), ws.subspan(2), u.view(st_sliced, 2, 3));
  }
  CHECK(whole == sliced);
  CHECK(st_whole.slots == st_sliced.slots);
}

TEST_CASE_TEMPLATE("make_updater and create_updater round trip" * doctest::timeout(60), T, float,
                   double) {
  const optim::sgd s{.learning_rate = 0.1,
                     .momentum = 0.9,
                     .weight_decay = 1e-4,
                     .rescale_grad = 1.0 / 3,
                     .clip_gradient = 5};
  const optim::adam a{.learning_rate = 3e-4, .beta2 = 0.98, .weight_decay = 0.1};
  const optim::adagrad h{.learning_rate = 0.7, .epsilon = 1e-6, .clip_gradient = 0.3};
  const std::vector<optim::updater<T>> made{optim::make_updater<T>(s), optim::make_updater<T>(a),
                                            optim::make_updater<T>(h)};
  const std::vector<int> slots{1, 2, 1};
  for (std::size_t i = 0; i < made.size(); ++i) {
    const auto& m = made[i];
    CAPTURE(m.name);
    CHECK(m.num_slots == slots[i]);
    const auto c = optim::create_updater<T>(m.name, m.params);
    CHECK(c.name == m.name);
    CHECK(c.params == m.params);  // parameters survive text serialization exactly
    CHECK(c.num_slots == m.num_slots);
    std::vector<T> w1{0.5, -1, 2}, w2 = w1;
    const std::vector<T> g{0.3, -0.7, 11};
    optim::state<T> s1, s2;
    for (int k = 0; k < 3; ++k) {
      m.apply(2, g, w1, s1);
      c.apply(2, g, w2, s2);
    }
    CHECK(w1 == w2);
    CHECK(s1.slots == s2.slots);
  }
  CHECK(made[0].name == "sgd");
  CHECK(made[1].name == "adam");
  CHECK(made[2].name == "adagrad");
}

TEST_CASE("unknown names and bad parameters are clear errors" * doctest::timeout(60)) {
  auto e = error_of([] { (void)optim::create_updater<float>("nope", ""); });
  REQUIRE(e);
  CHECK(e->code() == kvstore::errc::invalid_argument);
  CHECK(std::string(e->what()) ==
        "unknown optimizer \"nope\" (register it with KVSTORE_REGISTER_OPTIMIZER)");
  e = error_of([] { (void)optim::create_updater<double>("sgd", "garbage"); });
  REQUIRE(e);
  CHECK(e->code() == kvstore::errc::invalid_argument);
  CHECK(std::string(e->what()).find("sgd") != std::string::npos);
  e = error_of([] { (void)optim::create_updater<float>("adam", ""); });
  REQUIRE(e);
  CHECK(e->code() == kvstore::errc::invalid_argument);
  CHECK_FALSE(optim::is_registered("nope"));
}

TEST_CASE_TEMPLATE("a user optimizer registered with the macro is created by name" *
                       doctest::timeout(60),
                   T, float, double) {
  CHECK(optim::is_registered("my::signsgd"));
  const auto made = optim::make_updater<T>(my::signsgd{.learning_rate = 0.25});
  const auto u = optim::create_updater<T>("my::signsgd", made.params);
  CHECK(u.num_slots == 0);
  std::vector<T> w{1, 1, 1};
  const std::vector<T> g{5, -0.1, 0};
  optim::state<T> st;
  u.apply(0, g, w, st);
  CHECK(w == std::vector<T>{0.75, 1.25, 1});
}

TEST_CASE("registration is idempotent and refuses a second type under a taken name" *
          doctest::timeout(60)) {
  CHECK(optim::register_optimizer<optim::sgd>());
  CHECK(optim::register_optimizer<my::signsgd>());
  const auto e = error_of([] { (void)optim::register_optimizer<my::fake_sgd>(); });
  REQUIRE(e);
  CHECK(e->code() == kvstore::errc::invalid_argument);
  // The built-in is still the one served.
  const auto u =
      optim::create_updater<float>("sgd", optim::make_updater<float>(optim::sgd{}).params);
  std::vector<float> w{1};
  optim::state<float> st;
  u.apply(0, std::vector<float>{1}, w, st);
  CHECK(w[0] == doctest::Approx(0.99f));
}

TEST_CASE("parameters travel in the classic locale whatever the global one" *
          doctest::timeout(60)) {
  // A worker whose global locale writes decimal commas must still be understood by a server.
  struct comma : std::numpunct<char> {
    char do_decimal_point() const override { return ','; }
  };
  const std::locale old = std::locale::global(std::locale(std::locale::classic(), new comma));
  const auto made = optim::make_updater<double>(optim::sgd{.learning_rate = 0.5});
  const auto back = optim::create_updater<double>("sgd", made.params);
  std::locale::global(old);
  CHECK(made.params.find(',') == std::string::npos);
  CHECK(back.params == optim::make_updater<double>(optim::sgd{.learning_rate = 0.5}).params);
}

namespace thread_test {
struct opt_a {
  double x = 1;
  static constexpr std::string_view name = "thread_test::a";
  static constexpr int num_slots = 0;
  template <class T>
  void update(std::span<const T>, std::span<T> w, const optim::slots_view<T>&) const {
    for (auto& v : w) v += static_cast<T>(x);
  }
  template <class Ar>
  void serialize(Ar& ar, unsigned) {
    ar& x;
  }
};
}  // namespace thread_test

TEST_CASE("the registry is safe to use from many threads" * doctest::timeout(60)) {
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  const std::string params = optim::serialize_params(thread_test::opt_a{.x = 2});
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        optim::register_optimizer<thread_test::opt_a>();
        const auto u = optim::create_updater<double>("thread_test::a", params);
        const auto v = optim::create_updater<float>("adam", optim::serialize_params(optim::adam{}));
        std::vector<double> w{0};
        optim::state<double> st;
        u.apply(0, std::vector<double>{0}, w, st);
        if (w[0] == 2 && v.num_slots == 2) ++ok;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(ok == 1600);
}

// optim/simd.hpp: the four-lane loops of Adam and AdaGrad must give the scalar step's bits for
// every element: plain values, clipped ones, zeros, infinities and NaN, over lengths that leave
// a scalar tail, with and without weight decay and clipping.
TEST_CASE("adam and adagrad four lanes at a time give the scalar step's bits" *
          doctest::timeout(60)) {
  std::vector<float> special{0.f,   -0.f,   1e-30f,   -1e-30f,   3.5f, -3.5f,
                             1e30f, -1e30f, INFINITY, -INFINITY, NAN,  0.25f};
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (std::size_t n : {0u, 1u, 3u, 4u, 5u, 12u, 1001u}) {
    for (int variant = 0; variant < 4; ++variant) {
      CAPTURE(n);
      CAPTURE(variant);
      const double wd = variant & 1 ? 0.01 : 0, clip = variant & 2 ? 2.0 : -1;
      std::vector<float> g(n), w0(n);
      for (std::size_t i = 0; i < n; ++i) {
        g[i] = i < special.size() ? special[i] : std::sin(float(i)) * 4.f;
        w0[i] = i % 5 == 0 ? special[(i / 5) % special.size()] : std::cos(float(i));
      }
      // Adam: three steps, so m and v are not zero when the lanes read them.
      const optim::adam a{.learning_rate = 0.01, .weight_decay = wd, .clip_gradient = clip};
      std::vector<float> w1 = w0, m1(n), v1(n), w2 = w0, m2(n), v2(n);
      for (std::uint64_t step = 1; step <= 3; ++step) {
        const auto st = a.step_at<float>(step);
        const std::size_t done =
            kvstore::detail::adam_x4(st, g.data(), w1.data(), m1.data(), v1.data(), n);
        CHECK(done <= n);
        for (std::size_t i = done; i < n; ++i) st(g[i], w1[i], m1[i], v1[i]);
        for (std::size_t i = 0; i < n; ++i) st(g[i], w2[i], m2[i], v2[i]);
      }
      CHECK(same_bits(w1, w2));
      CHECK(same_bits(m1, m2));
      CHECK(same_bits(v1, v2));
      // AdaGrad, likewise.
      const optim::adagrad ag{.learning_rate = 0.1, .weight_decay = wd, .clip_gradient = clip};
      std::vector<float> x1 = w0, h1(n, 0.5f), x2 = w0, h2(n, 0.5f);
      for (int step = 0; step < 3; ++step) {
        const auto st = ag.step<float>();
        const std::size_t done = kvstore::detail::adagrad_x4(st, g.data(), x1.data(), h1.data(), n);
        for (std::size_t i = done; i < n; ++i) st(g[i], x1[i], h1[i]);
        for (std::size_t i = 0; i < n; ++i) st(g[i], x2[i], h2[i]);
      }
      CHECK(same_bits(x1, x2));
      CHECK(same_bits(h1, h2));
    }
  }
#if KVSTORE_OPTIM_SSE
  // On x86-64 the lanes run: all but the tail of 1001 elements.
  const optim::adam a;
  std::vector<float> g(1001, 1.f), w(1001), m(1001), v(1001);
  CHECK(kvstore::detail::adam_x4(a.step_at<float>(1), g.data(), w.data(), m.data(), v.data(),
                                 1001) == 1000);
#endif
}
