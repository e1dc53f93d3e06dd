#include <kvstore/local.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using kvstore::errc;
using kvstore::key;
using kvstore::local;
using store = kvstore::KVStore<local, float>;
using dstore = kvstore::KVStore<local, double>;

static_assert(!std::is_copy_constructible_v<store>);
static_assert(!std::is_copy_assignable_v<store>);
static_assert(std::is_nothrow_move_constructible_v<store>);
static_assert(std::is_nothrow_move_assignable_v<store>);

namespace {

// Runs f, which must throw kvstore::error with `code` and a message containing `part`.
template <class F>
void expect_error(F&& f, errc code, const std::string& part) {
  try {
    f();
    FAIL("no exception, expected: " << part);
  } catch (const kvstore::error& e) {
    CHECK(e.code() == code);
    const std::string what = e.what();
    INFO("what(): " << what);
    CHECK(what.find(part) != std::string::npos);
  }
}

template <class T = float>
std::vector<T> pulled(kvstore::KVStore<local, T>& kv, key k, std::size_t n) {
  std::vector<T> out(n, T{-999});
  kv.pull(k, out).wait();
  return out;
}

std::filesystem::path temp_file(const std::string& stem) {
  return std::filesystem::temp_directory_path() /
         ("kvstore_test_local_" + stem + "_" + std::to_string(::getpid()));
}

// A registered optimizer for exact checks of steps and per-element state:
// weight = step * 1000 + (updates this element had before) * 10 + grad.
struct step_probe {
  static constexpr std::string_view name = "test_local_step_probe";
  static constexpr int num_slots = 1;
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight,
              const kvstore::optim::slots_view<T>& s) const {
    for (std::size_t i = 0; i < weight.size(); ++i) {
      weight[i] = static_cast<T>(s.step) * 1000 + s.slot[0][i] * 10 + grad[i];
      s.slot[0][i] += 1;
    }
  }
  template <class Ar>
  void serialize(Ar&, unsigned) {}
};

}  // namespace

TEST_CASE("identity and local no-ops" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  CHECK(kv.type() == "local");
  CHECK(kv.rank() == 0);
  CHECK(kv.num_workers() == 1);
  kv.barrier();
  CHECK(kv.num_dead_node(6) == 0);
  CHECK(kv.num_dead_node(1, 1) == 0);
  kv.set_barrier_before_exit(true);
  expect_error([&] { kv.send_command_to_servers(1, "x"); }, errc::unsupported, "dist");
  store def;
  CHECK(def.type() == "local");
}

TEST_CASE("init, push stores the value, pull returns it; int and string keys" *
          doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  std::vector<float> v{1, 2, 3, 4};
  kv.init(3, v);
  kv.init("fc1.w", std::vector<float>{5, 6});
  CHECK(pulled(kv, 3, 4) == std::vector<float>{1, 2, 3, 4});
  CHECK(pulled(kv, "fc1.w", 2) == std::vector<float>{5, 6});
  CHECK(pulled(kv, std::string("fc1.w"), 2) == std::vector<float>{5, 6});

  // std::array in, raw span out.
  std::array<float, 4> a{10, 20, 30, 40};
  auto p = kv.push(3, a);
  p.wait();
  CHECK(p.ready());
  float raw[4] = {};
  kv.pull(3, std::span<float>(raw, 4)).wait();
  CHECK(raw[0] == 10);
  CHECK(raw[3] == 40);

  // A push replaces (no optimizer): a second push is not accumulated.
  kv.push("fc1.w", std::vector<float>{1, 1}).wait();
  kv.push(std::string_view("fc1.w"), std::vector<float>{7, 8}).wait();
  CHECK(pulled(kv, "fc1.w", 2) == std::vector<float>{7, 8});

  // Negative and large integer keys are fine.
  kv.init(-1, v);
  kv.init(std::int64_t{1} << 40, v);
  CHECK(pulled(kv, -1, 4) == v);
  CHECK(pulled(kv, std::int64_t{1} << 40, 4) == v);
}

TEST_CASE("double store" * doctest::timeout(60)) {
  dstore kv(kvstore::local_options{.threads = 1});
  std::vector<double> a{0.1, 0.2, 0.3}, b{1e-17, 0, 0}, c{1, 1, 1};
  kv.init("w", a);
  kv.push("w", {a, b, c}).wait();
  auto got = pulled<double>(kv, "w", 3);
  CHECK(got[0] == (0.1 + 1e-17) + 1.0);
  CHECK(got[1] == (0.2 + 0.0) + 1.0);
  CHECK(got[2] == (0.3 + 0.0) + 1.0);
}

TEST_CASE("multi-device push is summed, multi-out pull copies to each" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  kv.init(1, std::vector<float>(5, 0));
  std::vector<float> d0{1, 2, 3, 4, 5}, d1{10, 20, 30, 40, 50}, d2{100, 200, 300, 400, 500};
  auto pushed = kv.push(1, {d0, d1, d2});
  std::vector<float> o0(5), o1(5);
  std::array<float, 5> o2{};
  auto got = kv.pull(1, {o0, o1, o2});
  pushed.wait();
  got.wait();
  const std::vector<float> want{111, 222, 333, 444, 555};
  CHECK(o0 == want);
  CHECK(o1 == want);
  CHECK(std::vector<float>(o2.begin(), o2.end()) == want);
}

TEST_CASE("large values go through the parallel reduction" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2, .parallel_reduce_min = 1024});
  const std::size_t n = 300001;
  std::vector<float> a(n), b(n), c(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 1000);
    b[i] = 2;
    c[i] = -static_cast<float>(i % 7);
  }
  kv.init("big", a);
  kv.push("big", {a, b, c});
  auto out = pulled(kv, "big", n);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += out[i] != a[i] + b[i] + c[i];
  CHECK(bad == 0);
}

TEST_CASE("multi-key init, push and pull" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 3});
  std::vector<key> ks{1, "b", 3};
  std::vector<float> v1{1}, v2{2, 2}, v3{3, 3, 3};
  std::vector<std::span<const float>> vals{v1, v2, v3};
  kv.init(ks, vals);
  std::vector<float> p1{10}, p2{20, 21}, p3{30, 31, 32};
  std::vector<std::span<const float>> pv{p1, p2, p3};
  auto pushed = kv.push(ks, pv, 2);
  std::vector<float> o1(1), o2(2), o3(3);
  std::vector<std::span<float>> outs{o1, o2, o3};
  auto got = kv.pull(ks, outs, 1);
  got.wait();
  CHECK(pushed.ready());
  CHECK(o1 == p1);
  CHECK(o2 == p2);
  CHECK(o3 == p3);

  // A key listed twice in one push gets the sum, in one push.
  std::vector<key> dup{"b", 1, "b"};
  std::vector<float> q1{1, 2}, q2{5}, q3{100, 200};
  std::vector<std::span<const float>> qv{q1, q2, q3};
  kv.push(dup, qv).wait();
  CHECK(pulled(kv, "b", 2) == std::vector<float>{101, 202});
  CHECK(pulled(kv, 1, 1) == std::vector<float>{5});
  // ... and a pull listing it twice fills both outputs.
  std::vector<float> r1(2), r2(2);
  std::vector<std::span<float>> rout{r1, r2};
  std::vector<key> twice{"b", "b"};
  kv.pull(twice, rout).wait();
  CHECK(r1 == std::vector<float>{101, 202});
  CHECK(r2 == std::vector<float>{101, 202});

  // Empty lists: a done op.
  auto none = kv.push(std::span<const key>{}, std::span<const std::span<const float>>{});
  CHECK(none.ready());
}

TEST_CASE("pushpull" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  kv.init(9, std::vector<float>{1, 1});
  std::vector<float> out(2);
  kv.pushpull(9, std::vector<float>{4, 5}, out).wait();
  CHECK(out == std::vector<float>{4, 5});
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5});
  kv.pushpull(9, std::vector<float>{2, 4}, out).wait();
  CHECK(out == std::vector<float>{3, 3});
}

TEST_CASE("rows: push_rows stores rows, duplicates summed; pull_rows in order" *
          doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  // 4 rows of 3.
  std::vector<float> m{0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32};
  kv.init("emb", m, 3);
  std::vector<std::int64_t> rows{2, 0};
  std::vector<float> vals{-2, -2, -2, -1, -1, -1};
  kv.push_rows("emb", rows, vals).wait();
  CHECK(pulled(kv, "emb", 12) ==
        std::vector<float>{-1, -1, -1, 10, 11, 12, -2, -2, -2, 30, 31, 32});

  std::vector<std::int64_t> dup{3, 1, 3};
  std::vector<float> dv{1, 2, 3, 7, 7, 7, 10, 20, 30};
  kv.push_rows("emb", dup, dv).wait();
  CHECK(pulled(kv, "emb", 12) == std::vector<float>{-1, -1, -1, 7, 7, 7, -2, -2, -2, 11, 22, 33});

  std::vector<std::int64_t> want{3, 0, 3};
  std::vector<float> out(9);
  kv.pull_rows("emb", want, out).wait();
  CHECK(out == std::vector<float>{11, 22, 33, -1, -1, -1, 11, 22, 33});

  // No rows: nothing changes.
  kv.push_rows("emb", std::span<const std::int64_t>{}, std::span<const float>{}).wait();
  CHECK(pulled(kv, "emb", 12)[0] == -1);
}

TEST_CASE("rows with an optimizer: only the named rows, one step per push" * doctest::timeout(60)) {
  kvstore::optim::register_optimizer<step_probe>();
  store kv(kvstore::local_options{.threads = 2});
  kv.init(5, std::vector<float>(8, 0.5f), 2);  // 4 rows of 2
  kv.set_optimizer(step_probe{});
  std::vector<std::int64_t> r1{1, 3, 1};
  kv.push_rows(5, r1, std::vector<float>{1, 2, 3, 4, 5, 6}).wait();
  // step 1; row 1 gets 1+5, 2+6; row 3 gets 3, 4; no element updated before.
  CHECK(pulled(kv, 5, 8) == std::vector<float>{0.5f, 0.5f, 1006, 1008, 0.5f, 0.5f, 1003, 1004});
  std::vector<std::int64_t> r2{1, 0};
  kv.push_rows(5, r2, std::vector<float>{1, 1, 2, 2}).wait();
  // step 2; row 1 was updated once before.
  CHECK(pulled(kv, 5, 8) == std::vector<float>{2002, 2002, 2011, 2011, 0.5f, 0.5f, 1003, 1004});
  // A whole-key push is step 3, and sees the per-element counts.
  kv.push(5, std::vector<float>(8, 0)).wait();
  CHECK(pulled(kv, 5, 8) == std::vector<float>{3010, 3010, 3020, 3020, 3000, 3000, 3010, 3010});

  // sgd on rows: w -= lr * g on the named rows only.
  store kv2(kvstore::local_options{.threads = 1});
  kv2.init(1, std::vector<float>{1, 1, 1, 1, 1, 1}, 3);
  kv2.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5});
  std::vector<std::int64_t> r{1};
  kv2.push_rows(1, r, std::vector<float>{2, 4, -2}).wait();
  CHECK(pulled(kv2, 1, 6) == std::vector<float>{1, 1, 1, 0, -1, 2});
}

TEST_CASE("every misuse throws, names the key, changes nothing" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  const std::vector<float> v{1, 2, 3, 4};
  kv.init(7, v);
  kv.init("fc1.w", v);
  kv.init("emb", std::vector<float>(6, 1), 2);  // 3 rows of 2
  std::vector<float> out3(3), out4(4);
  std::vector<float> five(5, 9);

  SUBCASE("unknown key") {
    expect_error([&] { kv.push(8, v); }, errc::unknown_key, "key 8");
    expect_error([&] { kv.pull("nope", out4); }, errc::unknown_key, "\"nope\"");
    expect_error([&] { kv.pushpull(8, v, out4); }, errc::unknown_key, "key 8");
    std::vector<std::int64_t> r{0};
    expect_error([&] { kv.push_rows("nope", r, std::vector<float>(2)); }, errc::unknown_key,
                 "\"nope\"");
    expect_error([&] { kv.pull_rows(8, r, out4); }, errc::unknown_key, "8");
  }
  SUBCASE("size mismatch names both sizes") {
    expect_error([&] { kv.push(7, five); }, errc::size_mismatch, "key 7");
    expect_error([&] { kv.push(7, five); }, errc::size_mismatch, "5");
    expect_error([&] { kv.push(7, five); }, errc::size_mismatch, "4");
    expect_error(
        [&] {
          kv.push("fc1.w", {std::span<const float>(v), std::span<const float>(five)});
        },
        errc::size_mismatch, "\"fc1.w\"");
    expect_error([&] { kv.pull(7, out3); }, errc::size_mismatch, "size 3");
    expect_error(
        [&] {
          kv.pull(7, {std::span<float>(out4), std::span<float>(out3)});
        },
        errc::size_mismatch, "key 7");
    expect_error([&] { kv.pushpull(7, v, out3); }, errc::size_mismatch, "key 7");
    expect_error([&] { kv.pushpull(7, five, out4); }, errc::size_mismatch, "key 7");
  }
  SUBCASE("init twice, also within one multi-key init") {
    expect_error([&] { kv.init(7, v); }, errc::already_inited, "key 7");
    expect_error([&] { kv.init("fc1.w", std::vector<float>{1}); }, errc::already_inited,
                 "\"fc1.w\"");
    std::vector<key> ks{100, 101, 100};
    std::vector<std::span<const float>> vals{v, v, v};
    expect_error([&] { kv.init(ks, vals); }, errc::already_inited, "key 100");
    // All or nothing: 100 and 101 were not inited.
    expect_error([&] { kv.push(100, v); }, errc::unknown_key, "key 100");
    expect_error([&] { kv.push(101, v); }, errc::unknown_key, "key 101");
    std::vector<key> ks2{102, 7};
    std::vector<std::span<const float>> vals2{v, v};
    expect_error([&] { kv.init(ks2, vals2); }, errc::already_inited, "key 7");
    expect_error([&] { kv.push(102, v); }, errc::unknown_key, "key 102");
  }
  SUBCASE("bad matrix init") {
    expect_error([&] { kv.init(50, five, 2); }, errc::size_mismatch, "key 50");
    expect_error([&] { kv.init(51, five, 0); }, errc::invalid_argument, "key 51");
    expect_error([&] { kv.push(50, five); }, errc::unknown_key, "key 50");
  }
  SUBCASE("rows out of range, not a matrix, wrong row value sizes") {
    std::vector<std::int64_t> bad{0, 3};
    expect_error([&] { kv.push_rows("emb", bad, std::vector<float>(4, 5)); },
                 errc::row_out_of_range, "row 3");
    expect_error([&] { kv.push_rows("emb", bad, std::vector<float>(4, 5)); },
                 errc::row_out_of_range, "3 rows");
    std::vector<std::int64_t> neg{-1};
    std::vector<float> o2(2);
    expect_error([&] { kv.pull_rows("emb", neg, o2); }, errc::row_out_of_range, "\"emb\"");
    std::vector<std::int64_t> ok{0};
    expect_error([&] { kv.push_rows(7, ok, std::vector<float>(4)); }, errc::not_a_matrix, "key 7");
    expect_error([&] { kv.pull_rows(7, ok, out4); }, errc::not_a_matrix, "key 7");
    expect_error([&] { kv.push_rows("emb", ok, std::vector<float>(3, 5)); }, errc::invalid_argument,
                 "\"emb\"");
    expect_error([&] { kv.pull_rows("emb", ok, out4); }, errc::invalid_argument, "\"emb\"");
  }
  SUBCASE("empty lists and mismatched lengths") {
    expect_error([&] { kv.push(7, std::initializer_list<std::span<const float>>{}); },
                 errc::invalid_argument, "key 7");
    expect_error([&] { kv.pull(7, std::initializer_list<std::span<float>>{}); },
                 errc::invalid_argument, "key 7");
    std::vector<key> ks{7, "fc1.w"};
    std::vector<std::span<const float>> one{v};
    expect_error([&] { kv.push(ks, one); }, errc::invalid_argument, "2 keys");
    std::vector<std::span<float>> one_out{out4};
    expect_error([&] { kv.pull(ks, one_out); }, errc::invalid_argument, "2 keys");
    expect_error([&] { kv.init(ks, one); }, errc::invalid_argument, "2 keys");
    // A multi-key push with one bad key queues nothing.
    std::vector<key> ks3{"fc1.w", 7};
    std::vector<std::span<const float>> vals3{std::span<const float>(five),
                                              std::span<const float>(v)};
    expect_error([&] { kv.push(ks3, vals3); }, errc::size_mismatch, "\"fc1.w\"");
  }
  SUBCASE("an integer key on a name's id") {
    const auto id = static_cast<std::int64_t>(key::hash("fc1.w"));
    expect_error([&] { kv.push(id, v); }, errc::invalid_argument, "\"fc1.w\"");
    expect_error([&] { kv.init(id, v); }, errc::invalid_argument, "\"fc1.w\"");
  }
  SUBCASE("optimizer errors") {
    expect_error([&] { kv.set_optimizer(kvstore::optim::updater<float>{}); },
                 errc::invalid_argument, "empty");
  }
  // Whatever failed, nothing stored changed.
  CHECK(pulled(kv, 7, 4) == v);
  CHECK(pulled(kv, "fc1.w", 4) == v);
  CHECK(pulled(kv, "emb", 6) == std::vector<float>(6, 1));
}

TEST_CASE("errors inside a task reach op::wait; the key goes on" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  kv.init("k", std::vector<float>{1});
  kv.set_optimizer([](const key& k, std::span<const float> g, std::span<float> w) {
    if (g[0] < 0) throw kvstore::error(errc::invalid_argument, "negative grad for " + k.str());
    w[0] += g[0];
  });
  const std::vector<float> neg{-1}, pos{2};
  auto bad = kv.push("k", neg);
  auto good = kv.push("k", pos);
  CHECK_THROWS_WITH_AS(bad.wait(), "negative grad for \"k\"", kvstore::error);
  CHECK_THROWS_AS(bad.wait(), kvstore::error);  // every time
  good.wait();
  CHECK(pulled(kv, "k", 1) == std::vector<float>{3});
}

TEST_CASE("ops return at once; one key's ops run in order" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  kv.init(1, std::vector<float>{0});
  std::promise<void> gate;
  auto gf = gate.get_future().share();
  kv.set_optimizer([gf](const key&, std::span<const float> g, std::span<float> w) {
    gf.wait();
    w[0] = w[0] * 10 + g[0];
  });
  std::vector<float> g1{1}, g2{2}, g3{3}, out(1);
  auto p1 = kv.push(1, g1);
  auto p2 = kv.push(1, g2);
  auto p3 = kv.pushpull(1, g3, out);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(p1.ready());
  CHECK_FALSE(p3.ready());
  gate.set_value();
  kv.wait(1);
  CHECK(p1.ready());
  CHECK(p2.ready());
  CHECK(p3.ready());
  CHECK(out == std::vector<float>{123});
}

TEST_CASE("sgd: exact values after two pushes; multi-device gradients summed first" *
          doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  kv.init("w", std::vector<float>{1, 2});
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5, .momentum = 0.5});
  std::vector<float> g{1, 0.5f};
  kv.push("w", g);
  // mom = -0.5 * g = {-0.5, -0.25}; w = {0.5, 1.75}
  CHECK(pulled(kv, "w", 2) == std::vector<float>{0.5f, 1.75f});
  std::vector<float> h0{0.5f, 0.25f}, h1{0.5f, 0.25f};
  kv.push("w", {h0, h1});  // summed: {1, 0.5}
  // mom = 0.5 * mom - 0.5 * g = {-0.75, -0.375}; w = {-0.25, 1.375}
  CHECK(pulled(kv, "w", 2) == std::vector<float>{-0.25f, 1.375f});
}

TEST_CASE("a lambda optimizer; set_optimizer waits, keeps the state of the same type" *
          doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  kv.init(0, std::vector<float>{10, 10});
  kv.init("x", std::vector<float>{1});
  kv.push(0, std::vector<float>{3, 3}).wait();  // no optimizer yet: stored
  std::vector<std::string> seen;
  std::mutex m;
  kv.set_optimizer([&](const key& k, std::span<const float> g, std::span<float> w) {
    {
      std::lock_guard lk(m);
      seen.push_back(k.str());
    }
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 2 * g[i];
  });
  CHECK(pulled(kv, 0, 2) == std::vector<float>{3, 3});
  kv.push(0, std::vector<float>{1, -1}).wait();
  kv.push("x", std::vector<float>{0.25f}).wait();
  kv.wait_all();
  CHECK(pulled(kv, 0, 2) == std::vector<float>{1, 5});
  CHECK(pulled(kv, "x", 1) == std::vector<float>{0.5f});
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<std::string>{"\"x\"", "0"});

  // A new optimizer starts from fresh state: sgd momentum from zero.
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1, .momentum = 0.5});
  kv.push(0, std::vector<float>{1, 1}).wait();
  kv.push(0, std::vector<float>{1, 1}).wait();  // mom: -1, then -1.5
  CHECK(pulled(kv, 0, 2) == std::vector<float>{-1.5f, 2.5f});
  // The same type again (a learning-rate schedule) keeps the momentum: mom = 0.5 * -1.5 - 1.
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1, .momentum = 0.5});
  kv.push(0, std::vector<float>{1, 1}).wait();
  CHECK(pulled(kv, 0, 2) == std::vector<float>{-3.25f, 0.75f});
  // Another type starts fresh; back to sgd after it, the momentum restarts from zero: -1.
  kv.set_optimizer(kvstore::optim::add{});
  kv.push(0, std::vector<float>{1, 1}).wait();  // add: w += g
  CHECK(pulled(kv, 0, 2) == std::vector<float>{-2.25f, 1.75f});
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1, .momentum = 0.5});
  kv.push(0, std::vector<float>{1, 1}).wait();
  CHECK(pulled(kv, 0, 2) == std::vector<float>{-3.25f, 0.75f});
}

TEST_CASE("set_key_options scales a key's learning rate and weight decay" * doctest::timeout(60)) {
  store kv;
  kv.init(1, std::vector<float>{1, 1});
  kv.init(2, std::vector<float>{1, 1});
  kv.init(3, std::vector<float>{1, 1, 1, 1}, 2);
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.1, .weight_decay = 0.5});
  kv.set_key_options(2, {.lr_mult = 2.0, .wd_mult = 0.0});
  kv.set_key_options(3, {.lr_mult = 0.0});
  const std::vector<float> g{2, 2};  // alive until the ops are done
  kv.push(1, g);
  kv.push(2, g);
  const std::vector<std::int64_t> row{1};
  kv.push_rows(3, row, g);
  kv.wait_all();
  CHECK(pulled(kv, 1, 2) == std::vector<float>{0.75f, 0.75f});  // 1 - 0.1 * (2 + 0.5)
  CHECK(pulled(kv, 2, 2) == std::vector<float>{0.6f, 0.6f});    // 1 - 0.2 * 2
  CHECK(pulled(kv, 3, 4) == std::vector<float>{1, 1, 1, 1});    // lr x 0: frozen
  CHECK_THROWS_AS(kv.set_key_options(9, {}), kvstore::error);
  CHECK_THROWS_AS(kv.set_key_options(1, {.lr_mult = std::nan("")}), kvstore::error);
  CHECK(pulled(kv, 1, 2) == std::vector<float>{0.75f, 0.75f});
}

TEST_CASE_TEMPLATE("save/load optimizer states: identical continued training" *
                       doctest::timeout(60),
                   T, float, double) {
  using S = kvstore::KVStore<local, T>;
  const auto path = temp_file("roundtrip");
  const std::vector<T> w0{1, -2, 3, 0.5}, e0{1, 2, 3, 4, 5, 6};
  auto grad = [](int step, std::size_t n) {
    std::vector<T> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<T>(0.125 * step - 0.25 * i);
    return g;
  };
  auto setup = [&](S& kv, const std::vector<T>& w, const std::vector<T>& e) {
    kv.init("w", w);
    kv.init(42, e, 2);
    kv.set_optimizer(kvstore::optim::adam{.learning_rate = 0.01});
  };
  auto train = [&](S& kv, int from, int to) {
    for (int s = from; s < to; ++s) {
      kv.push("w", grad(s, 4)).wait();
      std::vector<std::int64_t> r{s % 3};
      kv.push_rows(42, r, grad(s, 2)).wait();
    }
  };

  S a(kvstore::local_options{.threads = 2});
  setup(a, w0, e0);
  train(a, 0, 3);
  a.save_optimizer_states(path);
  const auto wa = pulled<T>(a, "w", 4), ea = pulled<T>(a, 42, 6);
  train(a, 3, 6);

  // A second store with the weights at the checkpoint and the loaded states goes on exactly
  // like the first.
  S b(kvstore::local_options{.threads = 1});
  setup(b, wa, ea);
  b.load_optimizer_states(path);
  train(b, 3, 6);
  CHECK(pulled<T>(b, "w", 4) == pulled<T>(a, "w", 4));
  CHECK(pulled<T>(b, 42, 6) == pulled<T>(a, 42, 6));

  // Without the load the result differs (adam's moments and step matter).
  S c(kvstore::local_options{.threads = 1});
  setup(c, wa, ea);
  train(c, 3, 6);
  CHECK(pulled<T>(c, "w", 4) != pulled<T>(a, "w", 4));
  std::filesystem::remove(path);
}

TEST_CASE("a failed load changes no state" * doctest::timeout(60)) {
  const auto good = temp_file("good"), corrupt = temp_file("corrupt"), other = temp_file("other"),
             extra = temp_file("extra"), sized = temp_file("sized");
  auto setup = [](store& kv) {
    kv.init("w", std::vector<float>{1, 2, 3});
    kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5, .momentum = 0.5});
    kv.push("w", std::vector<float>{1, 1, 1}).wait();
  };
  store a(kvstore::local_options{.threads = 1}), twin(kvstore::local_options{.threads = 1});
  setup(a);
  setup(twin);
  a.save_optimizer_states(good);
  {
    // Flip a byte in the payload.
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes[bytes.size() - 3] ^= 0x5a;
    std::ofstream(corrupt, std::ios::binary) << bytes;
  }
  {
    store s(kvstore::local_options{.threads = 1});
    s.init("w", std::vector<float>{1, 2, 3});
    s.set_optimizer(kvstore::optim::adagrad{});
    s.push("w", std::vector<float>{1, 1, 1}).wait();
    s.save_optimizer_states(other);
  }
  {
    store s(kvstore::local_options{.threads = 1});
    s.init("w", std::vector<float>{1, 2, 3});
    s.init("unknown.key", std::vector<float>{1});
    s.set_optimizer(kvstore::optim::sgd{.momentum = 0.1});
    s.push("w", std::vector<float>{1, 1, 1}).wait();
    s.push("unknown.key", std::vector<float>{1}).wait();
    s.save_optimizer_states(extra);
  }
  {
    store s(kvstore::local_options{.threads = 1});
    s.init("w", std::vector<float>{1, 2});
    s.set_optimizer(kvstore::optim::sgd{.momentum = 0.1});
    s.push("w", std::vector<float>{1, 1}).wait();
    s.save_optimizer_states(sized);
  }
  expect_error([&] { a.load_optimizer_states(corrupt); }, errc::bad_file, "");
  expect_error([&] { a.load_optimizer_states(other); }, errc::bad_file, "adagrad");
  expect_error([&] { a.load_optimizer_states(extra); }, errc::unknown_key, "\"unknown.key\"");
  expect_error([&] { a.load_optimizer_states(sized); }, errc::size_mismatch, "\"w\"");
  expect_error([&] { a.load_optimizer_states(temp_file("missing")); }, errc::io_error, "");
  // a's momentum is what it was: its next steps equal the twin's.
  for (int i = 0; i < 2; ++i) {
    a.push("w", std::vector<float>{0.5f, -1, 2}).wait();
    twin.push("w", std::vector<float>{0.5f, -1, 2}).wait();
  }
  CHECK(pulled(a, "w", 3) == pulled(twin, "w", 3));
  // And the good file loads.
  a.load_optimizer_states(good);
  for (auto p : {good, corrupt, other, extra, sized}) std::filesystem::remove(p);
}

TEST_CASE("states of a callable or of no optimizer save and load" * doctest::timeout(60)) {
  const auto path = temp_file("callable");
  store kv(kvstore::local_options{.threads = 1});
  kv.init(1, std::vector<float>{1});
  kv.save_optimizer_states(path);  // no optimizer: an unnamed, empty file
  kv.load_optimizer_states(path);
  kv.set_optimizer([](const key&, std::span<const float> g, std::span<float> w) { w[0] += g[0]; });
  kv.push(1, std::vector<float>{1}).wait();
  kv.save_optimizer_states(path);
  kv.load_optimizer_states(path);
  kv.push(1, std::vector<float>{1}).wait();
  CHECK(pulled(kv, 1, 1) == std::vector<float>{3});
  kv.set_optimizer(kvstore::optim::sgd{});
  expect_error([&] { kv.load_optimizer_states(path); }, errc::bad_file, "sgd");
  std::filesystem::remove(path);
}

TEST_CASE("move construction and assignment" * doctest::timeout(60)) {
  store a(kvstore::local_options{.threads = 2});
  a.init("w", std::vector<float>{1, 2});
  std::vector<float> g{5, 6};
  auto p = a.push("w", g);
  store b(std::move(a));
  p.wait();
  CHECK(pulled(b, "w", 2) == std::vector<float>{5, 6});
  store c(kvstore::local_options{.threads = 1});
  c.init(1, std::vector<float>{0});
  c.push(1, std::vector<float>{9}).wait();
  c = std::move(b);  // c's old ops finish, then c is b's store
  CHECK(pulled(c, "w", 2) == std::vector<float>{5, 6});
  expect_error([&] { c.push(1, std::vector<float>{1}); }, errc::unknown_key, "key 1");
}

TEST_CASE("priorities: with one thread, a higher priority op queued behind a blocker runs first" *
          doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 1});
  for (int k = 0; k < 6; ++k) kv.init(k, std::vector<float>{0});
  kv.init(1000, std::vector<float>{0});
  std::promise<void> gate, started;
  auto gf = gate.get_future().share();
  std::vector<std::uint64_t> order;
  std::mutex m;
  kv.set_optimizer([&, gf](const key& k, std::span<const float>, std::span<float>) {
    if (k == key(1000)) {
      started.set_value();
      gf.wait();
      return;
    }
    std::lock_guard lk(m);
    order.push_back(k.id());
  });
  std::vector<float> g{1};
  kv.push(1000, g);
  started.get_future().wait();
  const int prio[] = {0, 5, 1, 5, 9, 1};
  for (int k = 0; k < 6; ++k) kv.push(k, g, prio[k]);
  gate.set_value();
  kv.wait_all();
  CHECK(order == std::vector<std::uint64_t>{4, 1, 3, 2, 5, 0});
}

TEST_CASE("calls from several threads" * doctest::timeout(60)) {
  store kv(kvstore::local_options{.threads = 2});
  std::vector<std::thread> ts;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&kv, &wrong, t] {
      for (int i = 0; i < 50; ++i) {
        const int k = t * 100 + i;
        kv.init(k, std::vector<float>{static_cast<float>(k)});
        std::vector<float> v{static_cast<float>(k + 1)}, out(1);
        kv.pushpull(k, v, out).wait();
        if (out[0] != static_cast<float>(k + 1)) ++wrong;
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(wrong == 0);
  CHECK(pulled(kv, 349, 1) == std::vector<float>{350});
}

TEST_CASE("grouping a multi-key call: first-appearance order, repeats joined, past the scan size" *
          doctest::timeout(10)) {
  // 40 keys, key 3 named again at positions 20 and 39: its group gets all three buffers, in
  // order, whichever way (scan or hash table) the grouping found it.
  std::vector<int> ids;
  for (int i = 0; i < 38; ++i) ids.push_back(i);
  ids.insert(ids.begin() + 20, 3);
  ids.push_back(3);
  std::vector<int> storage(100);
  std::vector<std::span<const int>> bufs;
  for (std::size_t i = 0; i < ids.size(); ++i) bufs.emplace_back(&storage[i], 1);
  auto groups = kvstore::detail::group_by_key<const int*>(
      std::span<const std::span<const int>>(bufs),
      [&](std::size_t i) { return &storage[50 + static_cast<std::size_t>(ids[i])]; },
      [](const int* a, const int* b) { return a == b; });
  REQUIRE(groups.size() == 38);
  for (std::size_t g = 0; g < groups.size(); ++g)
    CHECK(groups[g].h == &storage[50 + g]);  // first-appearance order
  REQUIRE(groups[3].bufs.size() == 3);
  CHECK(groups[3].bufs[0].data() == &storage[3]);
  CHECK(groups[3].bufs[1].data() == &storage[20]);
  CHECK(groups[3].bufs[2].data() == &storage[39]);
  CHECK(groups[37].bufs.size() == 1);
}

TEST_CASE("version: pushes applied to the key, after the ops issued on it before" *
          doctest::timeout(60)) {
  store kv;
  std::vector<float> v(4, 0.f), g(4, 1.f);
  kv.init(1, v);
  kv.init(2, v, 2);
  CHECK(kv.version(1) == 0);
  kv.push(1, g);
  kv.push(1, {std::span<const float>(g), std::span<const float>(g)});  // summed: one push
  std::vector<float> out(4);
  kv.pushpull(1, g, out);
  CHECK(kv.version(1) == 3);  // waits for the three ops on key 1 (not waited here)
  const std::int64_t rows[] = {1};
  kv.push_rows(2, rows, std::span<const float>(g.data(), 2));
  std::vector<key> ks{1, 2};
  std::vector<std::span<const float>> vals{g, g};
  kv.push(ks, vals);
  CHECK(kv.version(1) == 4);
  CHECK(kv.version(2) == 2);
  kv.pull(1, out).wait();  // a pull changes nothing
  CHECK(kv.version(1) == 4);
  expect_error([&] { (void)kv.version(9); }, errc::unknown_key, "key 9");
}

TEST_CASE(
    "element ranges: slice_of is the whole key on server 0; push_range stores or updates "
    "only its elements; pull_range reads them" *
    doctest::timeout(60)) {
  store kv;
  std::vector<float> init{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  kv.init(4, init);
  CHECK(kv.slice_of(4, 0) == std::pair<std::size_t, std::size_t>{0, 10});
  expect_error([&] { (void)kv.slice_of(4, 1); }, errc::invalid_argument, "server 1");
  expect_error([&] { (void)kv.slice_of(5, 0); }, errc::unknown_key, "key 5");

  std::vector<float> v{10, 20, 30};
  kv.push_range(4, 7, v).wait();
  std::vector<float> mid(4);
  kv.pull_range(4, 6, mid).wait();
  CHECK(mid == std::vector<float>{6, 10, 20, 30});
  std::vector<float> all(10);
  kv.pull(4, all).wait();
  CHECK(all == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 10, 20, 30});

  // With sgd (lr 0.5, momentum 0.5): the momentum slot of the range's elements only.
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5, .momentum = 0.5});
  std::vector<float> g{2, 4};
  kv.push_range(4, 1, g).wait();
  kv.push_range(4, 1, g).wait();
  kv.pull(4, all).wait();
  // step 1: mom = -1, -2; w = 0, 0. step 2: mom = -0.5 - 1 = -1.5, -1 - 2 = -3; w = -1.5, -3.
  CHECK(all == std::vector<float>{0, 1 - 1 - 1.5f, 2 - 2 - 3, 3, 4, 5, 6, 10, 20, 30});

  // Bad ranges: errors naming the key and the range; nothing changes.
  std::vector<float> three(3), none;
  expect_error([&] { kv.push_range(4, 8, three); }, errc::size_mismatch, "[8, 11)");
  expect_error([&] { kv.pull_range(4, 11, three); }, errc::size_mismatch, "key 4");
  expect_error([&] { kv.push_range(4, 2, none); }, errc::invalid_argument, "empty range");
  expect_error([&] { kv.pull_range(9, 0, three); }, errc::unknown_key, "[0, 3)");
  std::vector<float> again(10);
  kv.pull(4, again).wait();
  CHECK(again == all);
}
