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

class apply_pool {
 public:
  /// `threads` in all, the caller's included (0: the number of cores); 1 starts no helper.
  explicit apply_pool(unsigned threads) {
    for (unsigned i = 1; i < threads_for(threads); ++i) helpers_.emplace_back([this] { help(); });
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
    }
    wake_.notify_all();
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
      ++generation_;
    }
    wake_.notify_all();
    take_chunks();
    std::unique_lock lk(m_);
    // Every chunk done and every helper out of take_chunks: none reads job_ after this.
    done_.wait(lk, [&] { return left_ == 0 && active_ == 0; });
    job_ = {};
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  struct job {
    const std::function<void(std::uint64_t, std::uint64_t)>* fn = nullptr;
    std::uint64_t n = 0, chunks = 0;
  };

  // Takes chunks of the current job until none is left.
  void take_chunks() {
    for (;;) {
      const std::uint64_t c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= job_.chunks) return;
      const std::uint64_t lo = job_.n * c / job_.chunks, hi = job_.n * (c + 1) / job_.chunks;
      std::exception_ptr e;
      try {
        (*job_.fn)(lo, hi);
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard lk(m_);
      if (e && !error_) error_ = e;
      --left_;
    }
  }

  void help() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lk(m_);
        wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (!job_.fn) continue;  // woke after that run ended
        ++active_;
      }
      take_chunks();
      std::lock_guard lk(m_);
      --active_;
      done_.notify_one();
    }
  }

  std::mutex m_;
  std::condition_variable wake_, done_;
  // The current job: written under m_ before the helpers are woken, read by them after they
  // saw the new generation under m_; cleared by run() once every chunk is done.
  job job_;
  std::atomic<std::uint64_t> next_{0};
  std::uint64_t left_ = 0, generation_ = 0;
  unsigned active_ = 0;  // helpers inside take_chunks
  std::exception_ptr error_;
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace kvstore::detail
