// KVStore<device>: every call of KVStore<local>, with device_spans, over several devices; results
// compared with exact values and, for optimizers, with KVStore<local> doing the same work.
#include <kvstore/device.hpp>  // first: the header is self-contained

#include "device_test_support.hpp"

#include <kvstore/local.hpp>

#include <unistd.h>
#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

using kvstore::device_buffer;
using kvstore::device_options;
using kvstore::device_span;
using kvstore::errc;
using kvstore::key;
using dstore = kvstore::KVStore<kvstore::device, float>;
using lstore = kvstore::KVStore<kvstore::local, float>;
using dtest::dev;
using dtest::on;
using dtest::same;

static_assert(!std::is_copy_constructible_v<dstore>);
static_assert(std::is_nothrow_move_constructible_v<dstore>);
static_assert(std::is_aggregate_v<device_span<float>>);

namespace {

device_options opts(kvstore::placement p = kvstore::placement::balanced) {
  return device_options{.devices = dtest::devices(), .placement = p};
}

template <class T>
std::vector<T> host_pull(kvstore::KVStore<kvstore::device, T>& kv, key k, std::size_t n) {
  std::vector<T> out(n, T{-999});
  kv.pull(k, std::span<T>(out)).wait();
  return out;
}
std::vector<float> local_pull(lstore& kv, key k, std::size_t n) {
  std::vector<float> out(n, -999.f);
  kv.pull(k, std::span<float>(out)).wait();
  return out;
}

// Values that are not exact sums of powers of two, so any change of summation order shows.
template <class T = float>
std::vector<T> wiggly(std::size_t n, int seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] =
        static_cast<T>(
            0.1 * static_cast<double>((i * 7 + static_cast<std::size_t>(seed) * 13) % 101) - 3.3) /
        static_cast<T>(seed + 3);
  return v;
}

std::filesystem::path temp_file(const std::string& stem) {
  return std::filesystem::temp_directory_path() /
         ("kvstore_test_device_" + stem + "_" + std::to_string(::getpid()));
}

}  // namespace

TEST_CASE("identity and one-process no-ops" * doctest::timeout(60)) {
  dstore kv(opts());
  CHECK(kv.type() == "device");
  CHECK(kv.rank() == 0);
  CHECK(kv.num_workers() == 1);
  CHECK(kv.devices() == dtest::devices());
  kv.barrier();
  CHECK(kv.num_dead_node(6) == 0);
  kv.set_barrier_before_exit(true);
  dtest::expect_error([&] { kv.send_command_to_servers(1, "x"); }, errc::unsupported, {"servers"});
}

TEST_CASE("construction errors" * doctest::timeout(60)) {
  dtest::expect_error([] { dstore kv(device_options{.devices = {}}); }, errc::invalid_argument,
                      {"no devices"});
  dtest::expect_error(
      [] {
        dstore kv(device_options{.devices = {0, 0}});
      },
      errc::invalid_argument, {"device 0", "twice"});
  dtest::expect_error([] { dstore kv(device_options{.devices = {-1}}); }, errc::invalid_argument,
                      {"device -1", "does not exist"});
}

TEST_CASE(
    "init, push stores the value, pull returns it: device and host spans, int and string keys" *
    doctest::timeout(60)) {
  dstore kv(opts());
  const std::vector<float> a{1, 2, 3, 4}, b{5, 6, 7, 8};
  auto da = on(dev(1), a);
  kv.init(3, da.cspan());
  kv.init("fc1.w", std::span<const float>(b));
  CHECK(host_pull(kv, 3, 4) == a);
  CHECK(host_pull(kv, "fc1.w", 4) == b);

  auto db = on(dev(2), b);
  kv.push(3, db.cspan()).wait();
  device_buffer<float> out(4, dev(0));
  kv.pull(3, out.span()).wait();
  CHECK(out.to_host() == b);
  kv.push("fc1.w", std::span<const float>(a)).wait();
  kv.pull("fc1.w", out.span()).wait();
  CHECK(out.to_host() == a);
  // A non-const device_span converts to a const one.
  device_span<float> mutable_span = da.span();
  kv.push(3, device_span<const float>(mutable_span)).wait();
  CHECK(host_pull(kv, 3, 4) == a);
}

TEST_CASE("double store" * doctest::timeout(60)) {
  kvstore::KVStore<kvstore::device, double> kv(opts());
  const std::vector<double> a{0.1, 0.2, 0.3}, b{1e-17, 2, 3};
  auto da = on(dev(0), a);
  auto db = on(dev(1), b);
  kv.init(1, std::span<const double>(a));
  kv.push(1, {da.cspan(), db.cspan()}).wait();
  CHECK(host_pull(kv, 1, 3) == std::vector<double>{0.1 + 1e-17, 0.2 + 2, 0.3 + 3});
}

TEST_CASE(
    "a push of several devices' values is their sum, bit-exact with local; a pull broadcasts" *
    doctest::timeout(60)) {
  for (int k : {2, 3, 8, 9, 17}) {
    CAPTURE(k);
    const std::size_t n = 1000 + static_cast<std::size_t>(k);  // not a multiple of a vector width
    dstore kv(opts());
    lstore ref;
    std::vector<std::vector<float>> h;
    std::vector<device_buffer<float>> d;
    std::vector<device_span<const float>> spans;
    std::vector<std::span<const float>> hspans;
    for (int j = 0; j < k; ++j) h.push_back(wiggly(n, j + 1));
    for (int j = 0; j < k; ++j) {
      d.push_back(on(dev(static_cast<std::size_t>(j)), h[static_cast<std::size_t>(j)]));
      spans.push_back(d.back().cspan());
      hspans.push_back(h[static_cast<std::size_t>(j)]);
    }
    const std::vector<float> zero(n, 0.f);
    kv.init(7, std::span<const float>(zero));
    ref.init(7, std::span<const float>(zero));
    kv.push(7, std::span<const device_span<const float>>(spans)).wait();
    ref.push(std::span<const key>(std::vector<key>(static_cast<std::size_t>(k), key(7))),
             std::span<const std::span<const float>>(hspans))
        .wait();
    const auto want = local_pull(ref, 7, n);
    std::vector<float> exact(n);
    for (std::size_t i = 0; i < n; ++i) {
      float s = h[0][i];
      for (int j = 1; j < k; ++j) s = s + h[static_cast<std::size_t>(j)][i];
      exact[i] = s;
    }
    CHECK(want == exact);
    CHECK(host_pull(kv, 7, n) == exact);  // sums: exact on CUDA too

    device_buffer<float> o0(n, dev(0)), o1(n, dev(1)), o2(n, dev(2));
    kv.pull(7, {o0.span(), o1.span(), o2.span()}).wait();
    CHECK(o0.to_host() == exact);
    CHECK(o1.to_host() == exact);
    CHECK(o2.to_host() == exact);
  }
}

TEST_CASE("host values are staged in bounded chunks and summed like device values" *
          doctest::timeout(60)) {
  auto o = opts();
  o.staging_elems = 7;  // several chunks and a short last one
  dstore kv(o);
  const std::vector<float> a = wiggly(50, 1), b = wiggly(50, 2), c = wiggly(50, 3);
  auto dc = on(dev(1), c);
  kv.init(1, std::span<const float>(a));
  kv.push(1, {std::span<const float>(a), std::span<const float>(b)}).wait();
  std::vector<float> want(50);
  for (std::size_t i = 0; i < 50; ++i) want[i] = a[i] + b[i];
  CHECK(host_pull(kv, 1, 50) == want);
  // Mixed: a host value and a device value in one push (two calls, the multi-key form).
  const std::vector<key> ks{1, 1};
  std::vector<float> out(50);
  const std::array<device_span<const float>, 2> dv{dc.cspan(), dc.cspan()};
  kv.push(std::span<const key>(ks), std::span<const device_span<const float>>(dv)).wait();
  for (std::size_t i = 0; i < 50; ++i) want[i] = c[i] + c[i];
  CHECK(host_pull(kv, 1, 50) == want);
}

TEST_CASE("placement: balanced spreads keys by bytes; first puts every key on the first device" *
          doctest::timeout(60)) {
  const std::vector<float> big(1000, 1.f), small(10, 1.f);
  {
    dstore kv(opts(kvstore::placement::balanced));
    const auto ds = dtest::devices();
    for (int i = 0; i < static_cast<int>(ds.size()); ++i) kv.init(i, std::span<const float>(big));
    std::vector<int> owners;
    for (int i = 0; i < static_cast<int>(ds.size()); ++i) owners.push_back(kv.owner(i));
    CHECK(owners == ds);  // equal sizes: one per device, in order
    kv.init(100, std::span<const float>(small));
    CHECK(kv.owner(100) == ds[0]);
    // The next key goes where the fewest bytes are: not device 0 (1000 + 10 floats) when there
    // is another.
    kv.init(101, std::span<const float>(small));
    CHECK(kv.owner(101) == (ds.size() > 1 ? ds[1] : ds[0]));
  }
  {
    dstore kv(opts(kvstore::placement::first));
    for (int i = 0; i < 5; ++i) kv.init(i, std::span<const float>(big));
    for (int i = 0; i < 5; ++i) CHECK(kv.owner(i) == dtest::devices()[0]);
  }
  dstore kv(opts());
  dtest::expect_error([&] { (void)kv.owner(5); }, errc::unknown_key, {"key 5", "never inited"});
}

TEST_CASE("multi-key init, push and pull; a key named twice gets the sum" * doctest::timeout(60)) {
  dstore kv(opts());
  const std::vector<float> a{1, 2}, b{3, 4, 5}, c{10, 20};
  auto da = on(dev(0), a);
  auto db = on(dev(1), b);
  auto dc = on(dev(2), c);
  const std::vector<key> ks{"a", "b"};
  const std::vector<device_span<const float>> vs{da.cspan(), db.cspan()};
  kv.init(std::span<const key>(ks), std::span<const device_span<const float>>(vs));
  CHECK(host_pull(kv, "a", 2) == a);
  CHECK(host_pull(kv, "b", 3) == b);
  const std::vector<key> pk{"a", "b", "a"};
  const std::vector<device_span<const float>> pv{da.cspan(), db.cspan(), dc.cspan()};
  kv.push(std::span<const key>(pk), std::span<const device_span<const float>>(pv)).wait();
  CHECK(host_pull(kv, "a", 2) == std::vector<float>{11, 22});
  device_buffer<float> oa(2, dev(1)), ob(3, dev(2));
  const std::vector<device_span<float>> outs{oa.span(), ob.span()};
  kv.pull(std::span<const key>(ks), std::span<const device_span<float>>(outs)).wait();
  CHECK(oa.to_host() == std::vector<float>{11, 22});
  CHECK(ob.to_host() == b);
  // Host spans in the multi-key forms.
  std::vector<float> ha(2), hb(3);
  const std::vector<std::span<float>> houts{ha, hb};
  kv.pull(std::span<const key>(ks), std::span<const std::span<float>>(houts)).wait();
  CHECK(ha == std::vector<float>{11, 22});
  CHECK(hb == b);
  const std::vector<key> k2{7, 8};
  const std::vector<std::span<const float>> v2{std::span<const float>(a),
                                               std::span<const float>(c)};
  kv.init(std::span<const key>(k2), std::span<const std::span<const float>>(v2));
  kv.push(std::span<const key>(k2), std::span<const std::span<const float>>(v2)).wait();
  CHECK(host_pull(kv, 8, 2) == c);
  // All or nothing: a multi-key init naming a taken key inits none of them.
  const std::vector<key> k3{9, 7};
  dtest::expect_error(
      [&] { kv.init(std::span<const key>(k3), std::span<const std::span<const float>>(v2)); },
      errc::already_inited, {"key 7"});
  dtest::expect_error([&] { (void)host_pull(kv, 9, 2); }, errc::unknown_key, {"key 9"});
}

TEST_CASE("pushpull" * doctest::timeout(60)) {
  dstore kv(opts());
  const std::vector<float> a{1, 2, 3};
  kv.init(1, std::span<const float>(std::vector<float>(3, 0.f)));
  auto da = on(dev(1), a);
  device_buffer<float> out(3, dev(2));
  kv.pushpull(1, da.cspan(), out.span()).wait();
  CHECK(out.to_host() == a);
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 1});
  std::vector<float> h(3);
  kv.pushpull(1, std::span<const float>(a), std::span<float>(h)).wait();
  CHECK(h == std::vector<float>{0, 0, 0});
}

TEST_CASE(
    "init with init_options as local: row_length makes a matrix, placement and compression "
    "are ignored; set_gradient_compression validates and changes nothing" *
    doctest::timeout(60)) {
  dstore kv(opts());
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  auto dv = on(dev(1), v);
  kv.init("m", dv.cspan(), kvstore::init_options{.row_length = 3});
  kv.init("v", std::span<const float>(v),
          kvstore::init_options{.partition = kvstore::partition::even,
                                .compression = {.type = kvstore::compression::bf16}});
  const std::vector<std::int64_t> row1{1};
  std::vector<float> got(3);
  kv.pull_rows("m", row1, std::span<float>(got)).wait();
  CHECK(got == std::vector<float>{4, 5, 6});
  dtest::expect_error([&] { kv.pull_rows("v", row1, std::span<float>(got)); }, errc::not_a_matrix,
                      {"\"v\""});
  dtest::expect_error(
      [&] { kv.init("bad", std::span<const float>(v), kvstore::init_options{.row_length = 4}); },
      errc::size_mismatch, {"\"bad\"", "multiple"});

  kv.set_gradient_compression({.type = kvstore::compression::two_bit, .threshold = 0.5f});
  kv.set_gradient_compression({.type = kvstore::compression::fp16});
  // Not stored in a compressed form: values come back bit for bit.
  const std::vector<float> fine{1.0f + 1e-7f, 3.14159265f, -2.7182818f, 1e-30f, 5, 6};
  kv.push("v", std::span<const float>(fine)).wait();
  CHECK(host_pull(kv, "v", 6) == fine);
  dtest::expect_error(
      [&] {
        kv.set_gradient_compression({.type = kvstore::compression::two_bit, .threshold = 0.f});
      },
      errc::invalid_argument, {"threshold"});
  dtest::expect_error(
      [&] {
        kv.set_gradient_compression(
            {.type = static_cast<kvstore::compression::kind>(9), .threshold = 0.5f});
      },
      errc::invalid_argument, {"compression type 9"});
}

TEST_CASE("rows: push_rows stores rows, duplicates summed; pull_rows in the order named" *
          doctest::timeout(60)) {
  dstore kv(opts());
  std::vector<float> m(12);
  for (std::size_t i = 0; i < 12; ++i) m[i] = static_cast<float>(i);  // 4 rows of 3
  kv.init("m", std::span<const float>(m), 3);
  const std::vector<std::int64_t> rows{2, 0, 2};
  const std::vector<float> vals{1, 1, 1, 5, 5, 5, 2, 2, 2};
  auto dv = on(dev(1), vals);
  kv.push_rows("m", rows, dv.cspan()).wait();
  CHECK(host_pull(kv, "m", 12) == std::vector<float>{5, 5, 5, 3, 4, 5, 3, 3, 3, 9, 10, 11});
  const std::vector<std::int64_t> want_rows{3, 0, 3};
  device_buffer<float> out(9, dev(2));
  kv.pull_rows("m", want_rows, out.span()).wait();
  CHECK(out.to_host() == std::vector<float>{9, 10, 11, 5, 5, 5, 9, 10, 11});
  std::vector<float> hout(3);
  const std::vector<std::int64_t> one{1};
  kv.pull_rows("m", one, std::span<float>(hout)).wait();
  CHECK(hout == std::vector<float>{3, 4, 5});
  kv.push_rows("m", one, std::span<const float>(std::vector<float>{7, 8, 9})).wait();
  kv.pull_rows("m", one, std::span<float>(hout)).wait();
  CHECK(hout == std::vector<float>{7, 8, 9});
}

TEST_CASE_TEMPLATE("fused optimizers match KVStore<local>: several devices, several steps, rows" *
                       doctest::timeout(120),
                   O, kvstore::optim::sgd, kvstore::optim::adam, kvstore::optim::adagrad) {
  O o{};
  if constexpr (std::is_same_v<O, kvstore::optim::sgd>) {
    o = {.learning_rate = 0.1,
         .momentum = 0.9,
         .weight_decay = 1e-3,
         .rescale_grad = 0.5,
         .clip_gradient = 0.8};
  } else if constexpr (std::is_same_v<O, kvstore::optim::adam>) {
    o = {.learning_rate = 0.01, .weight_decay = 1e-3, .clip_gradient = 1.0};
  } else {
    o = {.learning_rate = 0.1, .weight_decay = 1e-3, .rescale_grad = 2.0};
  }
  const std::size_t n = 257;
  dstore kv(opts());
  lstore ref;
  const auto w0 = wiggly(n, 5);
  kv.init(1, std::span<const float>(w0));
  ref.init(1, std::span<const float>(w0));
  std::vector<float> m0(12, 0.5f);
  kv.init("m", std::span<const float>(m0), 4);
  ref.init("m", std::span<const float>(m0), 4);
  kv.set_optimizer(o);
  ref.set_optimizer(o);
  for (int step = 0; step < 4; ++step) {
    if (step == 2) {
      // Halfway: per-key multipliers, and the same type with half the learning rate, which keeps
      // every key's state (momentum, moments, history, adam's step) on both stores.
      kv.set_key_options(1, {.lr_mult = 2.0, .wd_mult = 0.5});
      ref.set_key_options(1, {.lr_mult = 2.0, .wd_mult = 0.5});
      kv.set_key_options("m", {.lr_mult = 0.5});
      ref.set_key_options("m", {.lr_mult = 0.5});
      O half = o;
      half.learning_rate *= 0.5;
      kv.set_optimizer(half);
      ref.set_optimizer(half);
    }
    const auto g1 = wiggly(n, 10 + step), g2 = wiggly(n, 20 + step), g3 = wiggly(n, 30 + step);
    auto d1 = on(dev(0), g1);
    auto d2 = on(dev(1), g2);
    auto d3 = on(dev(2), g3);
    kv.push(1, {d1.cspan(), d2.cspan(), d3.cspan()}).wait();
    ref.push(1,
             {std::span<const float>(g1), std::span<const float>(g2), std::span<const float>(g3)})
        .wait();
    const std::vector<std::int64_t> rows{2, 0, 2};
    const auto rv = wiggly(12, 40 + step);
    auto drv = on(dev(1), rv);
    kv.push_rows("m", rows, drv.cspan()).wait();
    ref.push_rows("m", rows, std::span<const float>(rv)).wait();
  }
  same(host_pull(kv, 1, n), local_pull(ref, 1, n));
  same(host_pull(kv, "m", 12), local_pull(ref, "m", 12));
  CHECK(kv.version(1) == 4);
  CHECK(kv.version("m") == ref.version("m"));
  CHECK_THROWS_AS(kv.set_key_options(99, {}), kvstore::error);
  CHECK_THROWS_AS(kv.version(99), kvstore::error);
  // Row 1 was never pushed: unchanged, exactly.
  const std::vector<std::int64_t> r1{1};
  std::vector<float> row(4);
  kv.pull_rows("m", r1, std::span<float>(row)).wait();
  CHECK(row == std::vector<float>(4, 0.5f));
}

TEST_CASE("sgd exact values; more than eight gradients folded before the update" *
          doctest::timeout(60)) {
  dstore kv(opts());
  kv.init(1, std::span<const float>(std::vector<float>{1, 2}));
  kv.set_optimizer(kvstore::optim::sgd{.learning_rate = 0.5});
  std::vector<device_buffer<float>> g;
  std::vector<device_span<const float>> s;
  for (int j = 0; j < 10; ++j)
    g.push_back(on(dev(static_cast<std::size_t>(j)), std::vector<float>{0.25f, 1.f}));
  for (auto& b : g) s.push_back(b.cspan());
  kv.push(1, std::span<const device_span<const float>>(s)).wait();  // grad {2.5, 10}
  CHECK(host_pull(kv, 1, 2) == std::vector<float>{1 - 1.25f, 2 - 5});
}

TEST_CASE("a callable optimizer runs on host copies; a user-registered type too" *
          doctest::timeout(60)) {
  dstore kv(opts());
  lstore ref;
  const std::vector<float> w{1, 2, 3};
  kv.init(1, std::span<const float>(w));
  ref.init(1, std::span<const float>(w));
  auto f = [](const key&, std::span<const float> g, std::span<float> wt) {
    for (std::size_t i = 0; i < g.size(); ++i) wt[i] = wt[i] * 2 + g[i];
  };
  kv.set_optimizer(f);
  ref.set_optimizer(f);
  auto d0 = on(dev(0), std::vector<float>{1, 1, 1});
  auto d1 = on(dev(1), std::vector<float>{0, 1, 2});
  kv.push(1, {d0.cspan(), d1.cspan()}).wait();
  CHECK(host_pull(kv, 1, 3) == std::vector<float>{3, 6, 9});
  // Rows through the host path as well.
  kv.init("m", std::span<const float>(std::vector<float>(4, 1.f)), 2);
  const std::vector<std::int64_t> rows{1};
  kv.push_rows("m", rows, std::span<const float>(std::vector<float>{1, 2})).wait();
  CHECK(host_pull(kv, "m", 4) == std::vector<float>{1, 1, 3, 4});
}

TEST_CASE("optimizer states: save, load, continue identically; the file is local's format" *
          doctest::timeout(120)) {
  const auto path = temp_file("states");
  const auto path2 = temp_file("states_local");
  const kvstore::optim::adam o{.learning_rate = 0.05};
  const std::size_t n = 33;
  auto grad = [&](int step) { return wiggly(n, 50 + step); };
  auto train = [&](auto& kv, int from, int to) {
    for (int s = from; s < to; ++s) {
      const auto g = grad(s);
      kv.push("w", std::span<const float>(g)).wait();
    }
  };
  const auto w0 = wiggly(n, 1);
  dstore a(opts());
  a.init("w", std::span<const float>(w0));
  a.set_optimizer(o);
  train(a, 0, 3);
  a.save_optimizer_states(path);
  const auto w3 = host_pull(a, "w", n);
  train(a, 3, 6);
  const auto w6 = host_pull(a, "w", n);

  // A fresh device store at step 3 with the loaded states goes on exactly as a did.
  dstore b(opts(kvstore::placement::first));
  b.init("w", std::span<const float>(w3));
  b.set_optimizer(o);
  b.load_optimizer_states(path);
  train(b, 3, 6);
  CHECK(host_pull(b, "w", n) == w6);

  // The local store reads the device store's file, and the other way round.
  lstore l;
  l.init("w", std::span<const float>(w3));
  l.set_optimizer(o);
  l.load_optimizer_states(path);
  l.save_optimizer_states(path2);
  train(l, 3, 6);
  same(local_pull(l, "w", n), w6);
  dstore c(opts());
  c.init("w", std::span<const float>(w3));
  c.set_optimizer(o);
  c.load_optimizer_states(path2);
  train(c, 3, 6);
  CHECK(host_pull(c, "w", n) == w6);

  // A failed load (another optimizer's file) changes nothing.
  dstore d(opts());
  d.init("w", std::span<const float>(w3));
  d.set_optimizer(kvstore::optim::sgd{});
  dtest::expect_error([&] { d.load_optimizer_states(path); }, errc::bad_file, {"adam"});
  std::filesystem::remove(path);
  std::filesystem::remove(path2);
}

TEST_CASE("every misuse throws at the call, names the key (and device), changes nothing" *
          doctest::timeout(60)) {
  dstore kv(opts());
  const std::vector<float> v{1, 2, 3, 4};
  kv.init(1, std::span<const float>(v));
  kv.init("m", std::span<const float>(v), 2);
  auto good = on(dev(0), std::vector<float>{9, 9, 9, 9});
  auto short_buf = on(dev(0), std::vector<float>{9, 9});

  dtest::expect_error([&] { kv.push(2, good.cspan()); }, errc::unknown_key,
                      {"push", "key 2", "never inited"});
  dtest::expect_error([&] { kv.pull(2, good.span()); }, errc::unknown_key, {"pull", "key 2"});
  dtest::expect_error([&] { kv.init(1, good.cspan()); }, errc::already_inited, {"key 1", "twice"});
  dtest::expect_error([&] { kv.push(1, short_buf.cspan()); }, errc::size_mismatch,
                      {"key 1", "size 2", "4"});
  dtest::expect_error([&] { kv.pull(1, short_buf.span()); }, errc::size_mismatch, {"key 1"});
  dtest::expect_error(
      [&] {
        kv.push(1, {good.cspan(), short_buf.cspan()});
      },
      errc::size_mismatch, {"key 1"});
  dtest::expect_error(
      [&] {
        kv.push(1, device_span<const float>{good.data(), 4, 99});
      },
      errc::invalid_argument, {"key 1", "device 99", "not one of the store's devices"});
  dtest::expect_error(
      [&] {
        kv.pull(1, device_span<float>{good.data(), 4, -3});
      },
      errc::invalid_argument, {"key 1", "device -3"});
  if (dtest::devices().size() > 1) {
    // Memory of device 1 stated as device 0's.
    auto other = on(dev(1), std::vector<float>{9, 9, 9, 9});
    dtest::expect_error(
        [&] {
          kv.push(1, device_span<const float>{other.data(), 4, dev(0)});
        },
        errc::invalid_argument, {"key 1", "on device " + std::to_string(dev(1))});
  }
  if (dtest::cuda) {
    std::vector<float> host(4);
    dtest::expect_error(
        [&] {
          kv.push(1, device_span<const float>{host.data(), 4, dev(0)});
        },
        errc::invalid_argument, {"key 1", "host memory"});
  }
  const std::vector<std::int64_t> bad_rows{0, 2};
  const std::vector<float> rv(4, 1.f);
  dtest::expect_error([&] { kv.push_rows("m", bad_rows, std::span<const float>(rv)); },
                      errc::row_out_of_range, {"\"m\"", "row 2"});
  const std::vector<std::int64_t> neg{-1};
  std::vector<float> two(2);
  dtest::expect_error([&] { kv.pull_rows("m", neg, std::span<float>(two)); },
                      errc::row_out_of_range, {"row -1"});
  const std::vector<std::int64_t> ok_rows{0};
  dtest::expect_error([&] { kv.push_rows(1, ok_rows, std::span<const float>(rv)); },
                      errc::not_a_matrix, {"key 1"});
  dtest::expect_error([&] { kv.push_rows("m", ok_rows, std::span<const float>(rv)); },
                      errc::invalid_argument, {"\"m\"", "1 rows of 2"});
  dtest::expect_error([&] { kv.init(5, std::span<const float>(v), 3); }, errc::size_mismatch,
                      {"key 5", "multiple"});
  dtest::expect_error([&] { kv.init(5, std::span<const float>(v), 0); }, errc::invalid_argument,
                      {"row_length"});
  const std::vector<key> ks{1, 2};
  const std::vector<device_span<const float>> vs{good.cspan(), good.cspan()};
  dtest::expect_error(
      [&] { kv.push(std::span<const key>(ks), std::span<const device_span<const float>>(vs)); },
      errc::unknown_key, {"key 2"});  // and key 1 is not pushed either
  // Nothing changed.
  CHECK(host_pull(kv, 1, 4) == v);
  CHECK(host_pull(kv, "m", 4) == v);
  dtest::expect_error([&] { (void)host_pull(kv, 5, 4); }, errc::unknown_key, {"key 5"});
}

TEST_CASE("ops on one key take effect in issue order, across priorities and streams" *
          doctest::timeout(60)) {
  dstore kv(opts());
  const std::size_t n = 1 << 12;
  kv.init(1, std::span<const float>(std::vector<float>(n, 0.f)));
  std::vector<device_buffer<float>> vals;
  for (int i = 0; i < 8; ++i)
    vals.push_back(on(dev(1), std::vector<float>(n, static_cast<float>(i))));
  std::vector<std::vector<float>> outs(8, std::vector<float>(n, -1.f));
  for (int i = 0; i < 8; ++i) {
    kv.push(1, vals[static_cast<std::size_t>(i)].cspan(), i % 2 ? 5 : 0);
    kv.pull(1, std::span<float>(outs[static_cast<std::size_t>(i)]), i % 3 ? 0 : 7);
  }
  kv.wait(1);
  for (int i = 0; i < 8; ++i)
    CHECK(outs[static_cast<std::size_t>(i)] == std::vector<float>(n, static_cast<float>(i)));
  // wait_all after ops on several keys; a stream_wait of a consumer stream returns.
  kv.init(2, std::span<const float>(std::vector<float>(n, 0.f)));
  auto op1 = kv.push(2, vals[3].cspan());
  kv.stream_wait(2, nullptr);
  kv.wait_all();
  CHECK(op1.ready());
  CHECK(host_pull(kv, 2, n) == std::vector<float>(n, 3.f));
  kv.wait(12345);  // a key never used: at once
}

TEST_CASE("a device_span's stream: the store's work waits for it" * doctest::timeout(60)) {
  dstore kv(opts());
  kvstore::device_stream s = kvstore::detail::rt::stream_create(dev(1), 0);
  auto d = on(dev(1), std::vector<float>{4, 5});
  kv.init(1, std::span<const float>(std::vector<float>{0, 0}));
  kv.push(1, device_span<const float>{d.data(), 2, dev(1), s}).wait();
  CHECK(host_pull(kv, 1, 2) == std::vector<float>{4, 5});
  kvstore::detail::rt::stream_destroy(dev(1), s);
}

TEST_CASE("move construction and assignment" * doctest::timeout(60)) {
  dstore a(opts());
  a.init(1, std::span<const float>(std::vector<float>{1}));
  dstore b(std::move(a));
  CHECK(host_pull(b, 1, 1) == std::vector<float>{1});
  dstore c(opts());
  c = std::move(b);
  c.push(1, std::span<const float>(std::vector<float>{2})).wait();
  CHECK(host_pull(c, 1, 1) == std::vector<float>{2});
}

TEST_CASE("staging for dist: gather sums devices' values into pinned memory, scatter broadcasts" *
          doctest::timeout(60)) {
  kvstore::device_staging<float> st;
  const auto a = wiggly(100, 1), b = wiggly(100, 2), c = wiggly(100, 3);
  auto da = on(dev(0), a);
  auto db = on(dev(1), b);
  auto dc = on(dev(2), c);
  const std::vector<device_span<const float>> in{da.cspan(), db.cspan(), dc.cspan()};
  auto sum = st.gather(in);
  REQUIRE(sum.size() == 100);
  for (std::size_t i = 0; i < 100; ++i) CHECK(sum[i] == (a[i] + b[i]) + c[i]);
  const std::vector<device_span<const float>> one{db.cspan()};
  auto copy = st.gather(one);
  CHECK(std::vector<float>(copy.begin(), copy.end()) == b);

  auto pinned = st.pinned(100);
  for (std::size_t i = 0; i < 100; ++i) pinned[i] = static_cast<float>(i);
  device_buffer<float> o0(100, dev(0)), o1(100, dev(1));
  const std::vector<device_span<float>> outs{o0.span(), o1.span()};
  st.scatter(std::span<const float>(pinned.data(), 100), outs);
  std::vector<float> want(100);
  for (std::size_t i = 0; i < 100; ++i) want[i] = static_cast<float>(i);
  CHECK(o0.to_host() == want);
  CHECK(o1.to_host() == want);
  dtest::expect_error([&] { (void)st.gather(std::span<const device_span<const float>>()); },
                      errc::invalid_argument, {"no values"});
}
