// The optimizer's cost: the largest key pushed while the servers apply Adam, and one thread's
// Adam loop over the same floats (what a server's update costs per round without its pool).
#include "cases.hpp"

#include <cmath>

namespace kv_bench {

// Last, after the baseline's phases have ended: the optimizer changes every later push.
void adam_push(kv_ctx& c, dense_kv& dense) {
  const config& cfg = c.cfg;
  if (!cfg.want("adam_push") || cfg.sizes.empty()) return;
  const std::size_t s = cfg.sizes.size() - 1;
  const auto& sc = cfg.sizes[s];
  const std::string name = "adam_push_" + std::to_string(sc.bytes);
  auto& vals = dense.vals[s];
  auto& outs = dense.outs[s];
  c.kv.set_optimizer(kvstore::optim::adam{});  // not collective; every worker may set it
  for (int rep = 0; rep < cfg.reps; ++rep) {
    c.bar.wait();
    auto a = mark();
    for (int i = 0; i < sc.push_n; ++i)
      c.kv.push(static_cast<int>(s), std::span<const float>(vals));
    c.kv.wait_all();
    auto b = clk::now();
    c.report({name, rep, double(sc.push_n), double(sc.push_n) * double(sc.bytes), secs(a, b)});
  }
  c.kv.pull(static_cast<int>(s), std::span<float>(outs)).wait();
  for (std::size_t i = 0; i < outs.size(); i += 4099)
    if (!std::isfinite(outs[i])) {
      std::fprintf(stderr, "kv_bench worker %d: %s: element %zu is %g\n", c.me, name.c_str(), i,
                   outs[i]);
      ++c.errors;
      break;
    }
}

// As local_bench's optimizer loop: GB/s of gradient, next to the servers' "push, servers apply
// Adam" row.
result adam_loop_bench(std::size_t n, int reps) {
  std::vector<float> grad(n, 0.5f), weight(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
  const kvstore::optim::adam opt;
  std::uint64_t step = 0;
  auto run = [&] {
    kvstore::optim::slots_view<float> sv;
    sv.step = ++step;
    sv.slot[0] = std::span<float>(m);
    sv.slot[1] = std::span<float>(v);
    opt.update<float>(std::span<const float>(grad), std::span<float>(weight), sv);
  };
  run();  // warm: pages touched
  const double t = median_secs(reps, run);
  const double gbps = double(n) * sizeof(float) / t / 1e9;
  std::printf(
      "\nAdam update loop, one thread, %s of float (median of %d): %.2f GB/s, %.3f ns per "
      "float\n",
      human(n * sizeof(float)).c_str(), reps, gbps, t / double(n) * 1e9);
  volatile float sink = weight[n / 2];
  (void)sink;
  return {"adam_loop_GBps", gbps, "GB/s", -1, -1, "optimizer"};
}

}  // namespace kv_bench
