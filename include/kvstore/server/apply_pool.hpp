// The threads a server applies large updates with (issue 12): the io thread serves frames one at
// a time, and an optimizer over a 64 MiB value on that thread alone falls behind the wire. A key's
// update is cut into chunks that the io thread and the pool's helpers take in turn; run() returns
// once all are done, so the shard's per-key order is untouched (nothing else runs meanwhile).
// Only element-wise updates are cut (optim::updater::elementwise): each element's result then
// depends on that element alone, and the chunks give the same bits as one pass. A batched push
// of many small keys is cut the same way, into runs of keys (server/batch.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kvstore::detail {

// Jobs come back to back (a frame's runs of keys, frame after frame), and a futex wake costs
// tens of microseconds on a loaded or virtual machine: a thread about to sleep until ready()
// spins this long first.
inline constexpr std::chrono::microseconds pool_spin_time{20};
template <class Pred>
void spin_until(Pred&& ready) {
  const auto until = std::chrono::steady_clock::now() + pool_spin_time;
  for (unsigned i = 1; !ready(); ++i) {
    if (i % 64 == 0 && std::chrono::steady_clock::now() > until) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

/// The parts of one apply_pool::run_parts job waiting for each other: each calls
/// arrive_and_wait() once, which returns when all have.
class part_barrier {
 public:
  explicit part_barrier(unsigned parts) : left_(parts) {}
  void arrive_and_wait() {
    if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lk(m_);  // a part between its check and its sleep sees 0 or is woken
      all_.notify_all();
      return;
    }
    spin_until([&] { return left_.load(std::memory_order_acquire) == 0; });
    std::unique_lock lk(m_);
    all_.wait(lk, [&] { return left_.load(std::memory_order_acquire) == 0; });
  }

 private:
  std::atomic<unsigned> left_;
  std::mutex m_;
  std::condition_variable all_;
};

class apply_pool {
 public:
  /// `threads` in all, the caller's included (0: the number of cores); 1 starts no helper.
  explicit apply_pool(unsigned threads) : wake_(threads_for(threads) - 1) {
    for (unsigned i = 1; i < threads_for(threads); ++i)
      helpers_.emplace_back([this, i] { help(i); });
  }
  /// The threads a pool asked for `threads` has (0: the number of cores).
  static unsigned threads_for(unsigned threads) noexcept {
    static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());  // read once
    return threads ? threads : cores;
  }
  ~apply_pool() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
      stopping_ = true;
    }
    wake(threads() - 1);
    for (auto& t : helpers_) t.join();
  }
  apply_pool(const apply_pool&) = delete;
  apply_pool& operator=(const apply_pool&) = delete;

  /// Threads that take chunks, the caller's included.
  unsigned threads() const noexcept { return static_cast<unsigned>(helpers_.size()) + 1; }

  /// fn(lo, hi) over [0, n) in chunks of at least `min_chunk` elements (one per thread at most,
  /// so each thread streams one contiguous range), the caller taking one. Returns once every
  /// chunk is done; the first exception a chunk threw is rethrown. One run at a time (the io
  /// thread's); fn must not call run().
  void run(std::uint64_t n, std::uint64_t min_chunk,
           const std::function<void(std::uint64_t, std::uint64_t)>& fn) {
    const std::uint64_t most =
        std::max<std::uint64_t>(1, n / std::max<std::uint64_t>(1, min_chunk));
    const std::uint64_t chunks = std::min<std::uint64_t>(threads(), most);
    if (chunks <= 1) return fn(0, n);
    {
      std::lock_guard lk(m_);
      job_ = {&fn, n, chunks};
      next_.store(0, std::memory_order_relaxed);
      left_ = chunks;
      error_ = nullptr;
      posted_.store(++generation_, std::memory_order_release);
    }
    wake(static_cast<unsigned>(chunks) - 1);
    take_chunks();
    auto lk = wait_done();
    job_ = {};
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  /// fn(p) for parts p = 0 .. parts - 1 at once, each on a thread of its own: part 0 on the
  /// caller, part p on helper p, the same thread for the same part every time, so what a part
  /// touched in one run is still in that thread's cache in the next, and parts may wait for each
  /// other. parts <= threads(). Returns once every part is done; the first exception a part
  /// threw is rethrown. One run at a time (the io thread's); fn must not call run().
  void run_parts(unsigned parts, const std::function<void(unsigned)>& fn) {
    if (parts <= 1) return fn(0);
    {
      std::lock_guard lk(m_);
      job_ = {nullptr, 0, std::min(parts, threads()), &fn};
      left_ = job_.chunks;
      error_ = nullptr;
      posted_.store(++generation_, std::memory_order_release);
    }
    wake(static_cast<unsigned>(job_.chunks) - 1);
    run_part(0);
    auto lk = wait_done();
    job_ = {};
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  struct job {
    const std::function<void(std::uint64_t, std::uint64_t)>* fn = nullptr;
    std::uint64_t n = 0, chunks = 0;
    const std::function<void(unsigned)>* part_fn = nullptr;  // run_parts' (chunks: its parts)
  };

  // One chunk or part of the current job: run, its exception kept if it is the first, counted
  // done.
  template <class F>
  void run_piece(F&& piece) {
    std::exception_ptr e;
    try {
      piece();
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard lk(m_);
    if (e && !error_) error_ = e;
    --left_;
  }
  // Part p of the current run_parts job.
  void run_part(unsigned p) {
    run_piece([&] { (*job_.part_fn)(p); });
  }

  // Wakes helpers 1 .. n (a job needs no more: a helper without a part or chunk would wake
  // only to sleep again, and on a many-core host most have none).
  void wake(unsigned n) {
    for (unsigned i = 0; i < n && i < wake_.size(); ++i) wake_[i].notify_one();
  }

  // Takes chunks of the current job until none is left; whether it took one.
  bool take_chunks() {
    for (bool took = false;; took = true) {
      const std::uint64_t c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= job_.chunks) return took;
      const std::uint64_t lo = job_.n * c / job_.chunks, hi = job_.n * (c + 1) / job_.chunks;
      run_piece([&] { (*job_.fn)(lo, hi); });
    }
  }

  // Helper `index` (1, 2, ...): takes chunks of run()'s jobs, and part `index` of run_parts'.
  // One that worked in the last job spins for the next before it sleeps; one that did not (no
  // part or chunk was left for it) sleeps at once.
  void help(unsigned index) {
    std::uint64_t seen = 0;
    for (bool worked = false;;) {
      bool part = false;
      if (worked)
        spin_until([&] {
          return posted_.load(std::memory_order_acquire) != seen ||
                 stopping_.load(std::memory_order_relaxed);
        });
      worked = false;
      {
        std::unique_lock lk(m_);
        wake_[index - 1].wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        // A run() that ended before this helper woke; a run_parts() with no part for it. (A
        // run_parts() does not end before each of its parts ran.)
        part = job_.part_fn != nullptr;
        if (part ? index >= job_.chunks : !job_.fn) continue;
        ++active_;
      }
      if (part) {
        run_part(index);
        worked = true;
      } else {
        worked = take_chunks();
      }
      {
        std::lock_guard lk(m_);
        --active_;
      }
      done_.notify_one();
    }
  }

  // The io thread: until every chunk or part is done and every helper is out of the job (none
  // reads job_ after this), the lock held.
  std::unique_lock<std::mutex> wait_done() {
    spin_until([&] {
      return left_.load(std::memory_order_acquire) == 0 &&
             active_.load(std::memory_order_acquire) == 0;
    });
    std::unique_lock lk(m_);
    done_.wait(lk, [&] { return left_ == 0 && active_ == 0; });
    return lk;
  }

  std::mutex m_;
  std::vector<std::condition_variable> wake_;  // helper i + 1 sleeps on wake_[i]
  std::condition_variable done_;
  // The current job: written under m_ before the helpers are woken, read by them after they
  // saw the new generation under m_; cleared by run() once every chunk is done.
  job job_;
  std::atomic<std::uint64_t> next_{0};
  // Written under m_; read without it too, while spinning (spin_until).
  std::atomic<std::uint64_t> left_{0}, posted_{0};  // chunks or parts left; generation_
  std::atomic<unsigned> active_{0};                 // helpers inside a job
  std::atomic<bool> stopping_{false};               // stop_
  std::uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace kvstore::detail
