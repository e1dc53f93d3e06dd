// What a shard does to a slice's numbers: sums the workers' pushes into its open sync round (the
// merge buffer and its coverage, server/coverage.hpp), and applies a gradient to its value
// through the optimizer; a large sum or element-wise update is cut over the apply pool's threads
// (server/apply_pool.hpp). The shard (server/shard.hpp) decides which pushes go where and when a
// round is complete; this file only does the arithmetic, on the thread that calls it.
#pragma once

#include <kvstore/key.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/server/apply_pool.hpp>
#include <kvstore/wire/encoding.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace kvstore::detail {

class slice_math {
 public:
  /// `apply_threads` as shard_config says (0: every core, 1: the calling thread alone).
  explicit slice_math(unsigned apply_threads) : apply_threads_(apply_threads) {}

  /// The optimizer for both element types (empty ones: a push's value is stored as it is).
  void use(optim::updater<float> f, optim::updater<double> d) {
    upd_f_ = std::move(f);
    upd_d_ = std::move(d);
  }

  template <class T>
  optim::updater<T>& updater() {
    if constexpr (std::is_same_v<T, float>)
      return upd_f_;
    else
      return upd_d_;
  }

  /// Adds or copies `n` elements at slice offset `rel` into the round's merge buffer (a large
  /// sum cut over the apply pool unless `may_cut` is false: a pool thread's own work).
  template <class T, class Slice>
  void contribute(Slice& s, std::uint64_t rel, const T* src, std::uint64_t n, bool may_cut = true) {
    // A whole small value, what each key of a batched frame and most one-key pushes bring: the
    // round's first push copies it, the next ones add to it, here and inline. Through the
    // general path below a one-float key cost 131 instructions a push, 30 of them the call's
    // own (callgrind of shard_bench's loop, 2 workers).
    if (rel == 0 && n == s.size() && n <= small_sum_elements) {
      T* m = reinterpret_cast<T*>(s.merge.data());
      if (s.cov.empty()) {
        if (n && m != src) std::memcpy(m, src, n * sizeof(T));  // (else read in place)
        s.cov.mark_whole(n);
        return;
      }
      if (s.cov.whole(n)) {
        sum_into<T>(m, src, n, /*may_cut=*/false);  // (too small to cut over the pool)
        return;
      }
    }
    contribute_ranges(s, rel, src, n, may_cut);
  }

  /// Applies `n` elements at slice offset `rel`: stores them (no optimizer) or updates the
  /// weights with them as the gradient (`new_step`: the first range of an update counts a step
  /// of the optimizer; cut over the apply pool when large, unless `may_cut` is false).
  template <class T, class Slice>
  void apply_range(Slice& s, const T* grad, std::uint64_t rel, std::uint64_t n, bool new_step,
                   bool may_cut = true) {
    T* w = reinterpret_cast<T*>(s.value.mutable_data()) + rel;
    auto& upd = updater<T>();
    if (!upd) {
      if (n) std::memcpy(w, grad, n * sizeof(T));  // an empty push has no payload pointer
      return;
    }
    auto& st = s.template state<T>();
    upd.ensure_state(st, s.size());
    if (new_step) ++st.step;
    const kvstore::key k(static_cast<std::int64_t>(s.key));
    auto update = [&](std::uint64_t lo, std::uint64_t hi) {
      upd.fn(k, std::span<const T>(grad + lo, hi - lo), std::span<T>(w + lo, hi - lo),
             optim::updater<T>::view(st, rel + lo, hi - lo, s.mult));
    };
    if (may_cut && upd.elementwise && cut_over_pool(n))
      return pool().run(n, parallel_apply_elements, update);
    update(0, n);
  }

  /// Applies a complete round's sum: with no optimizer and the whole value written, the merge
  /// buffer becomes the value and the old value's buffer the next merge buffer (no copy), unless
  /// a pull answer still sends the value; else each written range is applied, one optimizer step.
  /// The coverage is left for the caller to clear.
  template <class T, class Slice>
  void apply_round(Slice& s, bool may_cut) {
    const bool taken = !updater<T>() && s.cov.whole(s.size()) && s.value.take(s.merge);
    if (taken) return;
    bool first = true;
    s.cov.for_each([&](std::uint64_t b, std::uint64_t e) {
      apply_range<T>(s, reinterpret_cast<const T*>(s.merge.data()) + b, b, e - b, first, may_cut);
      first = false;
    });
  }

  /// The apply pool, started on the first large update (a shard that never sees one starts no
  /// thread).
  apply_pool& pool() {
    if (!pool_) pool_ = std::make_unique<apply_pool>(apply_threads_);
    return *pool_;
  }

 private:
  // An element-wise update or sum of at least twice this many elements is cut over the apply
  // pool's threads (1 MiB of float a chunk at least: less is not worth waking a thread for).
  static constexpr std::uint64_t parallel_apply_elements = std::uint64_t{1} << 18;

  // Values of at most this many elements take contribute's inline path.
  static constexpr std::uint64_t small_sum_elements = 64;

  // The general case: parts of the slice, pushes that overlap, large values (summed over the
  // apply pool). Out of line, so that contribute stays small enough to inline.
  template <class T, class Slice>
  [[gnu::noinline]] void contribute_ranges(Slice& s, std::uint64_t rel, const T* src,
                                           std::uint64_t n, bool may_cut) {
    T* m = reinterpret_cast<T*>(s.merge.data());
    s.cov.contribute(
        rel, rel + n,
        [&](std::uint64_t b, std::uint64_t e) {
          if (m + b != src + (b - rel))
            std::memcpy(m + b, src + (b - rel), (e - b) * sizeof(T));  // else read in place
        },
        [&](std::uint64_t b, std::uint64_t e) {
          sum_into<T>(m + b, src + (b - rel), e - b, may_cut);
        });
  }

  // d += a over n elements, cut over the apply pool's threads when large (as apply_range cuts
  // an update): each element's sum depends on that element alone, so the same bits. The loop
  // is the wire's plain add (blocks of 16 over restrict pointers), which GCC vectorizes at -O2,
  // RelWithDebInfo's and so kv_server's; a plain loop needs -O3 there.
  template <class T>
  void sum_into(T* d, const T* a, std::uint64_t n, bool may_cut) {
    auto add = [&](std::uint64_t lo, std::uint64_t hi) {
      wire::convert_elements<true>(a + lo, hi - lo, d + lo, [](T x) { return x; });
    };
    if (may_cut && cut_over_pool(n)) return pool().run(n, parallel_apply_elements, add);
    add(0, n);
  }

  bool cut_over_pool(std::uint64_t n) const {
    return apply_threads_ != 1 && n >= 2 * parallel_apply_elements;
  }

  unsigned apply_threads_;
  optim::updater<float> upd_f_;
  optim::updater<double> upd_d_;
  std::unique_ptr<apply_pool> pool_;  // see pool()
};

}  // namespace kvstore::detail
