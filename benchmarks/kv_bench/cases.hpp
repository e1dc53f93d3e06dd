// The groups of cases, one file each: what a group runs in a kvstore worker (a struct that inits
// its keys, then one call per repetition), in a baseline client, and what it prints. main.cpp
// orders them. The store is only declared here: its bodies are in kv_bench_kvstore.
#pragma once

#include "harness.hpp"
#include "raw_baseline.hpp"

#include <kvstore/dist.hpp>

#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace kv_bench {

using store = kvstore::KVStore<kvstore::dist, float>;

// A kvstore worker process: its store and what its cases share.
struct kv_ctx {
  store& kv;
  const config& cfg;
  int out;  // the pipe to the parent
  pipe_barrier bar;
  int W, me;  // workers, this one's rank
  int errors = 0;

  void report(const sample& s) const { kv_bench::report(out, s); }
  // Counts (and prints) got when an element is not the workers' sum of key k's values.
  void check(const std::vector<float>& got, std::size_t k, const char* what) {
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i] != expected_sum(W, k, i)) {
        std::fprintf(stderr, "kv_bench worker %d: %s of key %zu: element %zu is %g, expected %g\n",
                     me, what, k, i, got[i], expected_sum(W, k, i));
        ++errors;
        return;
      }
  }
};

// A baseline client process.
struct raw_ctx {
  raw_client& cl;
  const config& cfg;
  int out;
  pipe_barrier bar;
  int S;  // servers

  void report(const sample& s) const { kv_bench::report(out, s); }
};

// ---- dense.cpp: one key per size, push and pull back to back; 4 KiB push+wait ------------

struct dense_kv {
  explicit dense_kv(kv_ctx& c);  // inits one key per size (ids 0..)
  void sizes(int rep);           // per size: a push phase, a pull phase
  void pushwait(int rep);        // push+wait 4 KiB on key 0, then the raw ping-pong's phase

  kv_ctx& c;
  std::vector<std::vector<float>> vals, outs;  // per size (adam_push reuses the largest)
};
void dense_raw_sizes(raw_ctx& c, int rep);
void dense_raw_latency(raw_ctx& c, int rep);  // push+ack 4 KiB, then a 64-byte ping-pong
void pingpong_row(setup_table& t);            // the raw ping-pong's reference row

// ---- compressed.cpp: fp16, bf16 and 2-bit keys; the conversion loops ---------------------

// A compressed case: its name in measurements and the keys' compression.
struct encoding_case {
  std::string name;
  kvstore::compression c;
  bool pull;  // 2-bit compresses pushes only
};
extern const std::vector<encoding_case> encoding_cases;

struct compressed_kv {
  explicit compressed_kv(kv_ctx& c);  // inits one key per size and encoding case
  void rep(int rep);                  // per key: a push phase, a pull phase (not 2-bit)

  kv_ctx& c;
  std::vector<std::vector<float>> zvals, zouts;  // per size, shared by its cases
};
// Each encode and decode loop of wire/encoding.hpp over n floats next to memcpy (no network).
std::vector<result> conversion_bench(std::size_t n, int reps);

// ---- many_keys.cpp: 1,000 keys in flight; a backprop step of one call per key -------------

struct many_kv {
  explicit many_kv(kv_ctx& c);  // inits the many keys (ids 100..)
  void rep(int rep);
  void check_values();  // after the repetitions: some keys pulled and checked

  kv_ctx& c;
  std::vector<std::vector<float>> mvals;
};
struct backprop_kv {
  explicit backprop_kv(kv_ctx& c);  // inits the backprop keys (ids 5,000,000..), when asked
  void rep(int rep);

  kv_ctx& c;
  std::vector<std::vector<float>> bvals, bouts;
};
void many_raw(raw_ctx& c, int rep);
void backprop_raw(raw_ctx& c, int rep);
// The bytes of the first `keys` backprop keys together.
std::size_t backprop_bytes(std::size_t keys);

// ---- growth.cpp: N single-float keys in one init, push and pull call ----------------------

struct growth_kv {
  // One N's keys and buffers, made for the cases asked for (--only).
  struct keys_case {
    bool on = false;
    std::vector<kvstore::key> keys;
    std::vector<float> vals, outs;
    std::vector<std::span<const float>> in;
    std::vector<std::span<float>> out;
  };
  explicit growth_kv(kv_ctx& c);
  void rep(int rep);  // per N: init (first repetition), push, pull phases

  kv_ctx& c;
  std::vector<keys_case> cases;
};
void growth_raw(raw_ctx& c, int rep);
// The measurement names of growth case N: its init, push and pull ("keys_push_1000").
std::string growth_name(const char* what, std::size_t n);
// The setup's growth tables (time per key; the processes' CPU per key), results and figures.
void growth_table(const config& cfg, setup_table& t);

// ---- adam.cpp: the servers applying Adam; one thread's Adam loop --------------------------

// After the repetitions: the largest dense key pushed back to back once the servers run Adam.
void adam_push(kv_ctx& c, dense_kv& dense);
// One thread's Adam update over n floats, no network.
result adam_loop_bench(std::size_t n, int reps);

}  // namespace kv_bench
