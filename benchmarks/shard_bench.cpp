// shard_bench: what one server's shard (server/shard.hpp) costs per key to serve multi-key
// pushes of single-float keys, without a network: the batched frames a worker sends
// (client/batch.hpp: 4,096 keys each) are built once and handed to the shard as its io thread
// would, the next round's push numbers written between rounds (not timed).
// - 2 workers: each key's two pushes summed into a dist_sync round, applied when the second
//   comes (the work of a 2 x 2 job's server);
// - 1 worker: each push applied at once (no round to sum).
// Each at 1e4, 1e5 and 1e6 keys, with the apply pool's threads (dist_options::server_threads)
// at 1 (the io thread alone: the baseline, in the same run) and at 2, 4, ... up to the cores.
// ns per key and worker, and the speed-up: the baseline's time over this one's (above 1: faster
// than the io thread alone).
//
// usage: shard_bench [--quick] [--json FILE]
#include "bench_support.hpp"

#include <kvstore/server/shard.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace wire = kvstore::wire;

// Where the shard's answers go: counted, not sent. Empty when default-made, as the server's
// (a waiter of a batched frame holds one): nothing allocated per key.
struct count_port {
  std::shared_ptr<std::uint64_t> answers;
  void reply(std::uint64_t, kvstore::errc, std::string) const { ++*answers; }
  void send(const wire::header&, std::span<const std::byte>, std::shared_ptr<const void>,
            std::string = {}) const {
    ++*answers;
  }
  bool same_peer(const count_port& o) const { return answers == o.answers; }
};
using shard_t = kvstore::detail::shard<count_port>;

constexpr std::size_t frame_keys = 4096;  // client/batch.hpp's batch_frame_keys

// One batched frame of keys [first, first + n) of one float each.
struct frame {
  std::size_t first = 0;
  wire::header h;
  std::string meta;
  std::vector<float> payload;
};
std::vector<frame> frames_of(wire::cmd c, std::size_t keys, bool data) {
  std::vector<frame> out;
  for (std::size_t first = 0; first < keys; first += frame_keys) {
    const std::size_t n = std::min(frame_keys, keys - first);
    frame f;
    f.first = first;
    f.meta.assign(n * wire::batch_entry_size, '\0');
    for (std::size_t i = 0; i < n; ++i)
      wire::put_batch_entry(f.meta.data() + i * wire::batch_entry_size, {first + i, 1, 0});
    f.payload.assign(data ? n : 0, 1.0f);
    f.h =
        wire::batch_header(c, wire::dtype::f32, n, n, 0, c == wire::cmd::batch_init && data, false);
    f.h.payload_len = f.payload.size() * sizeof(float);
    out.push_back(std::move(f));
  }
  return out;
}
std::span<const std::byte> bytes_of(const frame& f) {
  return {reinterpret_cast<const std::byte*>(f.payload.data()), f.payload.size() * sizeof(float)};
}

// ns per key and worker of `rounds` rounds of pushes of `keys` keys from each of `workers`.
double measure(int workers, std::size_t keys, unsigned threads, int rounds) {
  kvstore::detail::shard_config c;
  c.num_workers = workers;
  c.apply_threads = threads;
  shard_t sh(c, [](bool, std::uint64_t) {});
  std::vector<count_port> ports;
  for (int r = 0; r < workers; ++r) ports.push_back({std::make_shared<std::uint64_t>(0)});
  std::uint64_t req = 0;
  auto handle = [&](int rank, frame& f) {
    f.h.req_id = ++req;
    sh.handle(rank, ports[static_cast<std::size_t>(rank)], f.h, f.meta, bytes_of(f));
  };
  for (int r = 0; r < workers; ++r)
    for (auto& f : frames_of(wire::cmd::batch_init, keys, r == 0)) handle(r, f);
  std::vector<std::vector<frame>> push(static_cast<std::size_t>(workers));
  for (auto& p : push) p = frames_of(wire::cmd::batch_push, keys, true);
  double timed = 0;
  for (int round = 1; round <= rounds + 1; ++round) {  // the first warms the caches and plans
    for (auto& p : push)
      for (auto& f : p)
        for (std::size_t i = 0; i < f.payload.size(); ++i)
          wire::put_batch_entry(f.meta.data() + i * wire::batch_entry_size,
                                {f.first + i, 1, static_cast<std::uint64_t>(round)});
    const auto t0 = bench::clk::now();
    for (int r = 0; r < workers; ++r)
      for (auto& f : push[static_cast<std::size_t>(r)]) handle(r, f);
    if (round > 1) timed += bench::secs(t0, bench::clk::now());
  }
  // Every frame answered: init, then one answer per push frame.
  const std::uint64_t want = (frames_of(wire::cmd::batch_push, keys, false).size()) *
                             static_cast<std::uint64_t>(rounds + 2);
  for (auto& p : ports)
    if (*p.answers != want)
      std::fprintf(stderr, "shard_bench: %llu answers, %llu expected\n",
                   static_cast<unsigned long long>(*p.answers),
                   static_cast<unsigned long long>(want));
  return timed * 1e9 / rounds / static_cast<double>(keys);
}

}  // namespace

int main(int argc, char** argv) {
  bench::common_options opts;
  for (int i = 1; i < argc; ++i)
    if (!opts.take(i, argc, argv)) {
      std::fprintf(stderr, "usage: shard_bench [--quick] [--json FILE]\n");
      return 2;
    }
  const bool quick = opts.quick;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<unsigned> threads{1};
  for (unsigned t = 2; t <= std::max(2u, cores); t *= 2) threads.push_back(t);
  const int reps = quick ? 1 : 5;
  std::printf(
      "shard_bench: one server's shard serving batched pushes of single-float keys "
      "(frames of %zu keys), ns per key and worker, median of %d; %u cores%s\n",
      frame_keys, reps, cores, quick ? " --quick" : "");
  std::printf("  workers      keys | %s\n",
              [&] {
                std::string s;
                for (unsigned t : threads)
                  s += "  " + std::to_string(t) + (t == 1 ? " thread " : " threads");
                return s + " | speed-up over 1 thread";
              }()
                  .c_str());
  for (int workers : {2, 1})
    for (std::size_t keys : {std::size_t{10'000}, std::size_t{100'000}, std::size_t{1'000'000}}) {
      if (quick && keys > 10'000) continue;
      const int rounds = keys >= 1'000'000 ? 2 : keys >= 100'000 ? 10 : 50;
      std::vector<double> med;
      for (unsigned t : threads) {
        std::vector<double> v;
        for (int r = 0; r < reps; ++r) v.push_back(measure(workers, keys, t, rounds));
        med.push_back(bench::summarize(v).med);
      }
      std::printf("  %7d %9zu |", workers, keys);
      for (double m : med) std::printf(" %9.1f", m);
      std::printf(" |");
      for (double m : med) std::printf(" %5.2fx", med[0] / m);
      std::printf("\n");
      for (std::size_t i = 0; i < threads.size(); ++i)
        bench::results.push_back({std::to_string(workers) + " workers, " + std::to_string(keys) +
                                      " keys, " + std::to_string(threads[i]) + " threads",
                                  med[i], "ns/key", med[0], med[0] / med[i]});
    }
  if (!opts.json.empty() && !bench::write_json(opts.json)) {
    std::fprintf(stderr, "shard_bench: cannot write %s\n", opts.json.c_str());
    return 1;
  }
  return 0;
}
