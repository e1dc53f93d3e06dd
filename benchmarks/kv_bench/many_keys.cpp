// Many one-key calls in flight: 1,000 keys of 4 KiB pushed, then wait_all; and a backprop step,
// 200 keys of 64 B to 16 KiB each pushed by its own call, wait_all, each pulled, wait_all.
#include "cases.hpp"

#include <algorithm>

namespace kv_bench {

namespace {
constexpr std::size_t small = 1024;  // a many-keys key: 4 KiB of float

// Backprop key i: id 5,000,000 + i, of 16, 256, 1024 or 4096 floats in turn (64 B to 16 KiB: the
// biases and weights of small layers).
int backprop_key(std::size_t i) { return 5'000'000 + static_cast<int>(i); }
std::size_t backprop_floats(std::size_t i) {
  static constexpr std::size_t f[] = {16, 256, 1024, 4096};
  return f[i % 4];
}
}  // namespace

std::size_t backprop_bytes(std::size_t keys) {
  std::size_t b = 0;
  for (std::size_t i = 0; i < keys; ++i) b += backprop_floats(i) * sizeof(float);
  return b;
}

many_kv::many_kv(kv_ctx& ctx) : c(ctx), mvals(c.cfg.many_keys, std::vector<float>(small)) {
  for (std::size_t k = 0; k < c.cfg.many_keys; ++k) {
    for (std::size_t i = 0; i < small; ++i) mvals[k][i] = value_of(c.me, 100 + k, i);
    c.kv.init(static_cast<int>(100 + k), std::span<const float>(mvals[k]));
  }
}

void many_kv::rep(int rep) {
  const config& cfg = c.cfg;
  c.bar.wait();
  auto a = mark();
  for (int r = 0, e = cfg.n("many_4096", cfg.many_rounds); r < e; ++r) {
    for (std::size_t k = 0; k < cfg.many_keys; ++k)
      c.kv.push(static_cast<int>(100 + k), std::span<const float>(mvals[k]));
    c.kv.wait_all();
  }
  auto b = clk::now();
  const double ops = double(cfg.n("many_4096", cfg.many_rounds)) * double(cfg.many_keys);
  c.report({"many_4096", rep, ops, ops * 4096.0, secs(a, b)});
}

// The many keys' values, checked once.
void many_kv::check_values() {
  std::vector<float> got(small);
  for (std::size_t k = 0; c.cfg.want("many_4096") && k < c.cfg.many_keys;
       k += std::max<std::size_t>(1, c.cfg.many_keys / 10)) {
    c.kv.pull(static_cast<int>(100 + k), std::span<float>(got)).wait();
    c.check(got, 100 + k, "pull after many-key pushes");
  }
}

backprop_kv::backprop_kv(kv_ctx& ctx) : c(ctx) {
  if (c.cfg.want("backprop"))
    for (std::size_t k = 0; k < c.cfg.backprop_keys; ++k) {
      bvals.emplace_back(backprop_floats(k));
      for (std::size_t i = 0; i < bvals.back().size(); ++i)
        bvals.back()[i] = value_of(c.me, static_cast<std::size_t>(backprop_key(k)), i);
      bouts.emplace_back(bvals.back().size(), 0.f);
      c.kv.init(backprop_key(k), std::span<const float>(bvals.back()));
    }
}

void backprop_kv::rep(int rep) {
  const config& cfg = c.cfg;
  c.bar.wait();
  const int steps = cfg.n("backprop", cfg.backprop_steps);
  auto a = mark();
  for (int st = 0; st < steps; ++st) {
    for (std::size_t k = 0; k < bvals.size(); ++k)
      c.kv.push(backprop_key(k), std::span<const float>(bvals[k]));
    c.kv.wait_all();
    for (std::size_t k = 0; k < bvals.size(); ++k)
      c.kv.pull(backprop_key(k), std::span<float>(bouts[k]));
    c.kv.wait_all();
  }
  auto b = clk::now();
  c.report({"backprop_" + std::to_string(cfg.backprop_keys), rep, double(steps),
            double(steps) * 2.0 * double(backprop_bytes(cfg.backprop_keys)), secs(a, b)});
  for (std::size_t k = 0; steps && k < bouts.size(); k += 7)
    c.check(bouts[k], static_cast<std::size_t>(backprop_key(k)), "pull of a backprop key");
}

// Each key's 4 KiB, from and to its own place, to its server, all written back to back.
void many_raw(raw_ctx& c, int rep) {
  const config& cfg = c.cfg;
  std::vector<raw_part> parts;
  for (std::size_t k = 0; k < cfg.many_keys; ++k) {
    auto p = parts_of(100 + k, 4096, c.S, k * 4096);
    parts.insert(parts.end(), p.begin(), p.end());
  }
  c.bar.wait();
  auto a = mark();
  for (int r = 0, e = cfg.n("many_4096", cfg.many_rounds); r < e; ++r)
    c.cl.batch(raw_push, parts, 1);
  auto b = clk::now();
  const double ops = double(cfg.n("many_4096", cfg.many_rounds)) * double(cfg.many_keys);
  c.report({"many_4096", rep, ops, ops * 4096.0, secs(a, b)});
}

// Every key's message to its server back to back, the acks; then every key's pull.
void backprop_raw(raw_ctx& c, int rep) {
  const config& cfg = c.cfg;
  std::vector<raw_part> parts;
  for (std::size_t k = 0, offset = 0; k < cfg.backprop_keys; ++k) {
    const std::size_t bytes = backprop_floats(k) * sizeof(float);
    auto p = parts_of(static_cast<std::uint64_t>(backprop_key(k)), bytes, c.S, offset);
    offset += bytes;
    parts.insert(parts.end(), p.begin(), p.end());
  }
  c.bar.wait();
  const int steps = cfg.n("backprop", cfg.backprop_steps);
  auto a = mark();
  for (int st = 0; st < steps; ++st) {
    c.cl.batch(raw_push, parts, 1);
    c.cl.batch(raw_pull, parts, 1);
  }
  auto b = clk::now();
  c.report({"backprop_" + std::to_string(cfg.backprop_keys), rep, double(steps),
            double(steps) * 2.0 * double(backprop_bytes(cfg.backprop_keys)), secs(a, b)});
}

}  // namespace kv_bench
