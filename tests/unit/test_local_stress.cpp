#include <kvstore/local.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

// Several threads issue random pushes, pulls, pushpulls and row ops with random priorities on one
// store; every value is an integer-valued float, so the expected results are exact.
//
// Phase 1 (no optimizer): each thread owns the keys k with k % threads == t and predicts every
// value it pulls. Phase 2 (a summing optimizer): all threads push gradients to all keys; the end
// value of each key is its start plus every thread's gradients, and one thread's pulls of a key
// never go backwards (gradients are non-negative and one thread's ops on a key run in order).

namespace {

constexpr int num_keys = 64;
constexpr std::size_t rows_per_key = 8;
constexpr std::size_t row_len = 16;
constexpr std::size_t key_size = rows_per_key * row_len;
constexpr int num_threads = 6;
constexpr int phase1_ops = 2000;  // per thread
constexpr int phase2_ops = 1500;  // per thread

using store = kvstore::KVStore<kvstore::local, float>;
using vec = std::vector<float>;

// One op in flight, with the buffers it uses (kept alive and unchanged until it is done) and, for
// a read, what it must see.
struct pending {
  kvstore::op o;
  int key = 0;
  vec in1, in2, out, expect;
  std::vector<std::int64_t> rows;
  std::vector<std::span<const float>> ins;
  std::vector<std::span<float>> outs;
  std::vector<kvstore::key> ks;
  vec out2;
};

vec random_values(std::mt19937& rng, std::size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  vec v(n);
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

std::string key_name(int k) { return k % 2 ? "layer" + std::to_string(k) + ".w" : std::string{}; }
kvstore::key key_of(int k) { return k % 2 ? kvstore::key(key_name(k)) : kvstore::key(k); }

}  // namespace

TEST_CASE("random concurrent ops, exact results" * doctest::timeout(120)) {
  store kv(kvstore::local_options{.threads = 4, .parallel_reduce_min = 64});
  std::vector<vec> start(num_keys);
  for (int k = 0; k < num_keys; ++k) {
    start[k] = vec(key_size);
    for (std::size_t i = 0; i < key_size; ++i) start[k][i] = static_cast<float>(k * 1000 + i);
    kv.init(key_of(k), start[k], row_len);
  }
  std::atomic<int> wrong{0}, errors{0};

  // ---- phase 1: owned keys, exact values ----
  auto phase1 = [&](int t) {
    std::mt19937 rng(1234 + t);
    std::vector<int> mine;
    for (int k = t; k < num_keys; k += num_threads) mine.push_back(k);
    std::vector<vec> value(num_keys);
    for (int k : mine) value[k] = start[k];
    std::deque<std::unique_ptr<pending>> inflight;
    auto settle = [&](std::size_t keep) {
      while (inflight.size() > keep) {
        auto& p = *inflight.front();
        try {
          p.o.wait();
        } catch (...) {
          ++errors;
        }
        if (!p.expect.empty() && p.out != p.expect) ++wrong;
        if (!p.out2.empty() && p.out2 != p.expect) ++wrong;
        inflight.pop_front();
      }
    };
    std::uniform_int_distribution<int> pick_key(0, static_cast<int>(mine.size()) - 1);
    std::uniform_int_distribution<int> prio(-3, 3), what(0, 7);
    std::uniform_int_distribution<std::int64_t> pick_row(0, rows_per_key - 1);
    for (int i = 0; i < phase1_ops; ++i) {
      const int k = mine[pick_key(rng)];
      auto p = std::make_unique<pending>();
      p->key = k;
      switch (what(rng)) {
        case 0:
        case 1:  // push one value
          p->in1 = random_values(rng, key_size, -50, 50);
          p->o = kv.push(key_of(k), p->in1, prio(rng));
          value[k] = p->in1;
          break;
        case 2: {  // push two values, summed
          p->in1 = random_values(rng, key_size, -50, 50);
          p->in2 = random_values(rng, key_size, -50, 50);
          p->o = kv.push(key_of(k), {p->in1, p->in2}, prio(rng));
          for (std::size_t j = 0; j < key_size; ++j) value[k][j] = p->in1[j] + p->in2[j];
          break;
        }
        case 3:  // pull into two outputs
          p->out.resize(key_size);
          p->out2.resize(key_size);
          p->expect = value[k];
          p->o = kv.pull(key_of(k), {p->out, p->out2}, prio(rng));
          break;
        case 4:  // pushpull
          p->in1 = random_values(rng, key_size, 0, 9);
          p->out.resize(key_size);
          p->o = kv.pushpull(key_of(k), p->in1, p->out, prio(rng));
          value[k] = p->in1;
          p->expect = value[k];
          break;
        case 5: {  // push_rows, maybe with a duplicate
          const std::size_t n = 1 + rng() % 3;
          for (std::size_t r = 0; r < n; ++r) p->rows.push_back(pick_row(rng));
          p->in1 = random_values(rng, n * row_len, -9, 9);
          p->o = kv.push_rows(key_of(k), p->rows, p->in1, prio(rng));
          // Rows named twice are summed; the sum replaces the row.
          std::vector<bool> seen(rows_per_key, false);
          for (std::size_t r = 0; r < n; ++r) {
            const auto row = static_cast<std::size_t>(p->rows[r]);
            for (std::size_t j = 0; j < row_len; ++j) {
              float& dst = value[k][row * row_len + j];
              dst = (seen[row] ? dst : 0.f) + p->in1[r * row_len + j];
            }
            seen[row] = true;
          }
          break;
        }
        case 6: {  // pull_rows
          const std::size_t n = 1 + rng() % 4;
          for (std::size_t r = 0; r < n; ++r) p->rows.push_back(pick_row(rng));
          p->out.resize(n * row_len);
          for (auto row : p->rows)
            for (std::size_t j = 0; j < row_len; ++j)
              p->expect.push_back(value[k][static_cast<std::size_t>(row) * row_len + j]);
          p->o = kv.pull_rows(key_of(k), p->rows, p->out, prio(rng));
          break;
        }
        default: {  // multi-key push of two of my keys, then a multi-key pull
          const int k2 = mine[pick_key(rng)];
          p->in1 = random_values(rng, key_size, -5, 5);
          p->in2 = random_values(rng, key_size, -5, 5);
          p->ks = {key_of(k), key_of(k2)};
          p->ins = {p->in1, p->in2};
          p->o = kv.push(p->ks, p->ins, prio(rng));
          if (k == k2) {
            for (std::size_t j = 0; j < key_size; ++j) value[k][j] = p->in1[j] + p->in2[j];
          } else {
            value[k] = p->in1;
            value[k2] = p->in2;
          }
          inflight.push_back(std::move(p));
          p = std::make_unique<pending>();
          p->ks = {key_of(k2)};
          p->out.resize(key_size);
          p->outs = {p->out};
          p->expect = value[k2];
          p->o = kv.pull(p->ks, p->outs, prio(rng));
          break;
        }
      }
      inflight.push_back(std::move(p));
      if (rng() % 64 == 0) kv.wait(key_of(k));
      settle(rng() % 16 == 0 ? 0 : 24);
    }
    settle(0);
    for (int k : mine) {
      vec out(key_size);
      kv.pull(key_of(k), out).wait();
      if (out != value[k]) ++wrong;
    }
  };
  {
    std::vector<std::jthread> ts;
    for (int t = 0; t < num_threads; ++t) ts.emplace_back(phase1, t);
  }
  CHECK(errors == 0);
  CHECK(wrong == 0);

  // ---- phase 2: shared keys, a summing optimizer ----
  std::vector<vec> base(num_keys, vec(key_size));
  for (int k = 0; k < num_keys; ++k) kv.pull(key_of(k), base[k]);
  kv.wait_all();
  kv.set_optimizer([](const kvstore::key&, std::span<const float> g, std::span<float> w) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] += g[i];
  });
  std::vector<std::vector<vec>> added(num_threads, std::vector<vec>(num_keys, vec(key_size, 0)));
  auto phase2 = [&](int t) {
    std::mt19937 rng(999 + t);
    std::deque<std::unique_ptr<pending>> inflight;
    std::vector<vec> last_seen(num_keys);  // per key: the last pull that completed
    auto settle = [&](std::size_t keep) {
      while (inflight.size() > keep) {
        auto& p = *inflight.front();
        try {
          p.o.wait();
        } catch (...) {
          ++errors;
        }
        if (!p.out.empty() && p.rows.empty()) {
          auto& prev = last_seen[p.key];
          if (!prev.empty())
            for (std::size_t j = 0; j < key_size; ++j)
              if (p.out[j] < prev[j]) {
                ++wrong;
                break;
              }
          prev = p.out;
        }
        inflight.pop_front();
      }
    };
    std::uniform_int_distribution<int> pick_key(0, num_keys - 1), prio(-5, 5), what(0, 4);
    std::uniform_int_distribution<std::int64_t> pick_row(0, rows_per_key - 1);
    for (int i = 0; i < phase2_ops; ++i) {
      const int k = pick_key(rng);
      auto p = std::make_unique<pending>();
      p->key = k;
      switch (what(rng)) {
        case 0:
          p->in1 = random_values(rng, key_size, 0, 3);
          p->o = kv.push(key_of(k), p->in1, prio(rng));
          for (std::size_t j = 0; j < key_size; ++j) added[t][k][j] += p->in1[j];
          break;
        case 1:
          p->in1 = random_values(rng, key_size, 0, 2);
          p->in2 = random_values(rng, key_size, 0, 2);
          p->o = kv.push(key_of(k), {p->in1, p->in2}, prio(rng));
          for (std::size_t j = 0; j < key_size; ++j) added[t][k][j] += p->in1[j] + p->in2[j];
          break;
        case 2:
          p->in1 = random_values(rng, key_size, 0, 3);
          p->out.resize(key_size);
          p->o = kv.pushpull(key_of(k), p->in1, p->out, prio(rng));
          for (std::size_t j = 0; j < key_size; ++j) added[t][k][j] += p->in1[j];
          break;
        case 3: {
          const std::size_t n = 1 + rng() % 3;
          for (std::size_t r = 0; r < n; ++r) p->rows.push_back(pick_row(rng));
          p->in1 = random_values(rng, n * row_len, 0, 3);
          p->o = kv.push_rows(key_of(k), p->rows, p->in1, prio(rng));
          for (std::size_t r = 0; r < n; ++r)
            for (std::size_t j = 0; j < row_len; ++j)
              added[t][k][static_cast<std::size_t>(p->rows[r]) * row_len + j] +=
                  p->in1[r * row_len + j];
          break;
        }
        default:
          p->out.resize(key_size);
          p->o = kv.pull(key_of(k), p->out, prio(rng));
          break;
      }
      inflight.push_back(std::move(p));
      settle(rng() % 32 == 0 ? 0 : 16);
    }
    settle(0);
  };
  {
    std::vector<std::jthread> ts;
    for (int t = 0; t < num_threads; ++t) ts.emplace_back(phase2, t);
  }
  kv.wait_all();
  CHECK(errors == 0);
  CHECK(wrong == 0);
  int bad_keys = 0;
  for (int k = 0; k < num_keys; ++k) {
    vec want = base[k];
    for (int t = 0; t < num_threads; ++t)
      for (std::size_t j = 0; j < key_size; ++j) want[j] += added[t][k][j];
    vec out(key_size);
    kv.pull(key_of(k), out).wait();
    if (out != want) ++bad_keys;
  }
  CHECK(bad_keys == 0);
}
