// Dense one-key cases: each size's key pushed, then pulled, back to back; 4 KiB push+wait (the
// latency), and the raw 64-byte ping-pong it is judged against.
#include "cases.hpp"

#include <algorithm>

namespace kv_bench {

dense_kv::dense_kv(kv_ctx& ctx) : c(ctx) {
  for (std::size_t s = 0; s < c.cfg.sizes.size(); ++s) {
    const std::size_t n = c.cfg.sizes[s].bytes / sizeof(float);
    vals.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) vals.back()[i] = value_of(c.me, s, i);
    outs.emplace_back(n, 0.f);
    c.kv.init(static_cast<int>(s), std::span<const float>(vals.back()));
  }
}

void dense_kv::sizes(int rep) {
  const config& cfg = c.cfg;
  for (std::size_t s = 0; s < cfg.sizes.size(); ++s) {
    const auto& sc = cfg.sizes[s];
    const int key = static_cast<int>(s);
    const std::string tag = std::to_string(sc.bytes);
    c.bar.wait();
    auto a = mark();
    for (int i = 0, e = cfg.n("push_" + tag, sc.push_n); i < e; ++i)
      c.kv.push(key, std::span<const float>(vals[s]));
    c.kv.wait_all();
    auto b = clk::now();
    c.report({"push_" + tag, rep, double(cfg.n("push_" + tag, sc.push_n)),
              double(sc.push_n) * double(sc.bytes), secs(a, b)});
    c.bar.wait();
    // (Filling a 64 MiB output is most of an --only run's time: only for a pull asked for.)
    if (cfg.want("pull_" + tag)) std::fill(outs[s].begin(), outs[s].end(), -1.f);
    a = mark();
    for (int i = 0, e = cfg.n("pull_" + tag, sc.pull_n); i < e; ++i)
      c.kv.pull(key, std::span<float>(outs[s]));
    c.kv.wait_all();
    b = clk::now();
    c.report({"pull_" + tag, rep, double(cfg.n("pull_" + tag, sc.pull_n)),
              double(sc.pull_n) * double(sc.bytes), secs(a, b)});
    if (cfg.want("push_" + tag) && cfg.want("pull_" + tag)) c.check(outs[s], s, "pull");
  }
}

// 4 KiB push, waiting for each (sizes[0] is 4 KiB).
void dense_kv::pushwait(int rep) {
  const config& cfg = c.cfg;
  c.bar.wait();
  auto a = mark();
  for (int i = 0, e = cfg.n("pushwait_4096", cfg.latency_n); i < e; ++i)
    c.kv.push(0, std::span<const float>(vals[0])).wait();
  auto b = clk::now();
  c.report({"pushwait_4096", rep, double(cfg.n("pushwait_4096", cfg.latency_n)),
            double(cfg.latency_n) * 4096.0, secs(a, b)});
  c.bar.wait();  // the baseline's 64-byte ping-pong phase: nothing to do here
}

void dense_raw_sizes(raw_ctx& c, int rep) {
  const config& cfg = c.cfg;
  for (std::size_t s = 0; s < cfg.sizes.size(); ++s) {
    const auto& sc = cfg.sizes[s];
    const auto parts = parts_of(s, sc.bytes, c.S);
    const std::string tag = std::to_string(sc.bytes);
    c.bar.wait();
    auto a = mark();
    for (int i = 0, e = cfg.n("push_" + tag, sc.push_n); i < e; ++i) c.cl.batch(raw_push, parts, 1);
    auto b = clk::now();
    c.report({"push_" + tag, rep, double(cfg.n("push_" + tag, sc.push_n)),
              double(sc.push_n) * double(sc.bytes), secs(a, b)});
    c.bar.wait();
    a = mark();
    for (int i = 0, e = cfg.n("pull_" + tag, sc.pull_n); i < e; ++i) c.cl.batch(raw_pull, parts, 1);
    b = clk::now();
    c.report({"pull_" + tag, rep, double(cfg.n("pull_" + tag, sc.pull_n)),
              double(sc.pull_n) * double(sc.bytes), secs(a, b)});
  }
}

void dense_raw_latency(raw_ctx& c, int rep) {
  const config& cfg = c.cfg;
  const auto parts = parts_of(0, 4096, c.S);
  c.bar.wait();
  auto a = mark();
  for (int i = 0, e = cfg.n("pushwait_4096", cfg.latency_n); i < e; ++i)
    c.cl.batch(raw_push, parts, 1);
  auto b = clk::now();
  c.report({"pushwait_4096", rep, double(cfg.n("pushwait_4096", cfg.latency_n)),
            double(cfg.latency_n) * 4096.0, secs(a, b)});
  // 64-byte ping-pong with the key's server.
  const std::vector<raw_part> pp{{parts.front().server, 64}};
  c.bar.wait();
  a = mark();
  for (int i = 0, e = cfg.n("pingpong_64", cfg.pingpong64_n); i < e; ++i)
    c.cl.batch(raw_ping, pp, 1);
  b = clk::now();
  c.report({"pingpong_64", rep, double(cfg.n("pingpong_64", cfg.pingpong64_n)),
            double(cfg.pingpong64_n) * 64.0, secs(a, b)});
}

void pingpong_row(setup_table& t) {
  figure pp = aggregate(t.base, "pingpong_64");
  if (!pp.present) return;
  std::printf("  %-8s %-26s %12s %8s %12.0f %8s %6s | %8s %8.1f %6s %6.2f  (%.1f us round trip)\n",
              "64 B", "raw ping-pong (reference)", "-", "-", pp.ops_s, "-", "-", "-", pp.cpu_us_op,
              "-", pp.csw_op, 1e6 / pp.ops_s * t.W);
  t.results.push_back({"raw_" + t.cl + "_pingpong_64_ops", pp.ops_s, "ops/s", -1, -1, t.cl});
  t.figs[t.cl + "pingpong"] = pp;
}

}  // namespace kv_bench
