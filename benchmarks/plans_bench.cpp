// plans_bench: what a server's frame plans (server/frame_plans.hpp, the rules of
// detail/list_plans.hpp) cost a batched frame as the lists they hold grow from 8 to max_plans.
// Two kinds of frame of 32 keys (the smallest that is planned):
// - one-off: a list never seen before (sparse rows, a peer's ever new frames): its search finds
//   no plan, and it is remembered in place of an older memory;
// - followed: a planned list, found by its signature (8 lists in turn, spread over those held).
// A server looks up every frame it gets, so neither may grow with the lists held: each is
// compared with the same frame against 8 lists, in the same run (target: at most 1.5x at
// max_plans).
//
// usage: plans_bench [--quick] [--json FILE]
#include "bench_support.hpp"

#include <kvstore/server/frame_plans.hpp>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

namespace {

using kvstore::wire::dtype;
struct slice {  // what a plan compares of a server's slice
  std::uint64_t key = 0, total = 0;
  dtype type = dtype::f32;
};
using plans_t = kvstore::detail::frame_plans<slice>;
constexpr std::size_t keys_per_frame = plans_t::min_keys;

// A frame naming keys [first, first + keys_per_frame): its entries' bytes and its slices.
struct frame {
  std::string meta;
  std::vector<slice*> slices;
};
std::deque<slice> shard;  // never moves
frame frame_of(std::uint64_t first) {
  frame f;
  f.meta.assign(keys_per_frame * kvstore::wire::batch_entry_size, '\0');
  for (std::size_t i = 0; i < keys_per_frame; ++i) {
    kvstore::wire::put_batch_entry(f.meta.data() + i * kvstore::wire::batch_entry_size,
                                   {first + i, 1, 0});
    f.slices.push_back(&shard.emplace_back(slice{first + i, 1, dtype::f32}));
  }
  return f;
}
void saw(plans_t& p, const frame& f) {
  p.found(kvstore::wire::batch_entries(f.meta), dtype::f32, f.slices, 0, std::size_t{1} << 30);
}

// Nanoseconds per frame, one-off and followed, with `lists` lists planned.
struct costs {
  double one_off, followed;
};
costs measure(std::size_t lists, int frames) {
  plans_t p;
  std::vector<frame> planned;
  for (std::size_t i = 0; i < lists; ++i) {
    planned.push_back(frame_of(1'000'000 + 100 * i));
    saw(p, planned.back());
    saw(p, planned.back());
  }
  std::size_t hits = 0;
  frame fresh = frame_of(0);
  auto t0 = bench::clk::now();
  for (int i = 0; i < frames; ++i) {
    // A new first key: a list never seen.
    kvstore::wire::put_batch_entry(fresh.meta.data(), {100'000'000ull + i, 1, 0});
    const kvstore::wire::batch_entries e(fresh.meta);
    hits += p.find(e, dtype::f32, 0) != nullptr;
    p.found(e, dtype::f32, fresh.slices, 0, std::size_t{1} << 30);
  }
  auto t1 = bench::clk::now();
  // 8 lists in turn in every row (their bytes as hot as a frame just read), spread over the
  // lists held: only how many are held beside them differs.
  for (int i = 0; i < frames; ++i) {
    const frame& f = planned[static_cast<std::size_t>(i) % 8 * (lists / 8)];
    hits += p.find(kvstore::wire::batch_entries(f.meta), dtype::f32, 0) != nullptr;
  }
  auto t2 = bench::clk::now();
  if (hits != static_cast<std::size_t>(frames)) std::fprintf(stderr, "plans_bench: bad hits\n");
  return {bench::secs(t0, t1) * 1e9 / frames, bench::secs(t1, t2) * 1e9 / frames};
}

}  // namespace

int main(int argc, char** argv) {
  bench::common_options opts;
  for (int i = 1; i < argc; ++i)
    if (!opts.take(i, argc, argv)) {
      std::fprintf(stderr, "usage: plans_bench [--quick] [--json FILE]\n");
      return 2;
    }
  const bool quick = opts.quick;
  const std::string& json = opts.json;
  const int frames = quick ? 20'000 : 400'000, reps = quick ? 3 : 9;
  std::printf(
      "plans_bench: a server's frame plans, %zu-key frames, ns per frame (median of %d)%s\n",
      keys_per_frame, reps, quick ? " --quick (no targets judged)" : "");
  std::printf("  lists held |  one-off  followed | x one-off  x followed (vs 8 lists)\n");
  costs base{};
  bool ok = true;
  for (std::size_t lists : {std::size_t{8}, std::size_t{64}, plans_t::max_plans}) {
    std::vector<double> one_off, followed;
    for (int r = 0; r < reps; ++r) {
      const costs c = measure(lists, frames);
      one_off.push_back(c.one_off);
      followed.push_back(c.followed);
    }
    const costs c{bench::summarize(one_off).med, bench::summarize(followed).med};
    if (lists == 8) base = c;
    std::printf("  %10zu | %8.1f  %8.1f | %9.2f  %10.2f\n", lists, c.one_off, c.followed,
                c.one_off / base.one_off, c.followed / base.followed);
    const std::string at = " frame, " + std::to_string(lists) + " lists held";
    bench::results.push_back(
        {"one-off" + at, c.one_off, "ns", base.one_off, c.one_off / base.one_off});
    bench::results.push_back(
        {"followed" + at, c.followed, "ns", base.followed, c.followed / base.followed});
    if (lists == plans_t::max_plans && !quick)
      for (double x : {c.one_off / base.one_off, c.followed / base.followed}) ok = ok && x <= 1.5;
  }
  if (!quick)
    std::printf("Target: each at %zu lists within 1.5x its cost at 8: %s\n", plans_t::max_plans,
                ok ? "met" : "NOT met");
  if (!json.empty() && !bench::write_json(json)) {
    std::fprintf(stderr, "plans_bench: cannot write %s\n", json.c_str());
    return 1;
  }
  return ok ? 0 : 1;
}
