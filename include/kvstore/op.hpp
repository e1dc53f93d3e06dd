// kvstore::op, the handle of one asynchronous operation, and detail::op_state, the one
// completion mechanism under it: a count of parts, the first error, and an optional continuation.
#pragma once

#include <kvstore/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace kvstore {

namespace detail {
/// What a wait on an op not yet done asks of the store that made it, first and then again while
/// it waits: to send now what it holds back for a while (small-key fusion's waiting pushes,
/// client/fusion.hpp), so a caller that waits never pays that while. The store outlives every op
/// of its that is not done.
struct wait_hook {
  virtual void before_wait() = 0;

 protected:
  ~wait_hook() = default;
};

/// Shared state of one asynchronous operation made of `remaining` parts (one per key, slice or
/// message). The first error wins; the op is done when every part has completed. The same state
/// fans requests in inside the library: `then`, when set, runs once with the first error (or
/// nullptr) on the thread that completes the last part.
struct op_state {
  using continuation = std::function<void(std::exception_ptr)>;

  explicit op_state(std::size_t parts = 1, continuation next = {})
      : remaining(parts), then(std::move(next)) {}
  std::mutex m;
  std::condition_variable cv;
  std::size_t remaining;
  std::exception_ptr error;
  std::atomic<bool> finished{false};  // remaining reached 0 (read without the lock by spinners)
  unsigned spin_us = 0;               // wait() polls `finished` this long before sleeping
  unsigned sleepers = 0;              // threads asleep in wait_done (under m)
  wait_hook* hurry = nullptr;         // asked by wait() before and as it waits (set before shared)
  continuation then;

  /// Sleeps until every part has completed (`lk` holds m). The last part wakes only ops that
  /// have a sleeper: most ops of a busy worker are done before anyone waits on them.
  void wait_done(std::unique_lock<std::mutex>& lk) {
    if (remaining == 0) return;
    ++sleepers;
    cv.wait(lk, [&] { return remaining == 0; });
    --sleepers;
  }

  void complete_part(std::exception_ptr e = nullptr) {
    std::exception_ptr first;
    {
      std::lock_guard lk(m);
      if (e && !error) error = e;
      if (remaining == 0 || --remaining != 0) return;
      finished.store(true, std::memory_order_release);
      if (sleepers) cv.notify_all();
      if (!then) return;
      first = error;
    }
    then(first);
  }
  void add_parts(std::size_t n) {
    std::lock_guard lk(m);
    remaining += n;
  }
};
}  // namespace detail

/// Handle of one asynchronous operation. Copies share the operation.
/// Completion rule: wait() returns once every part of the operation has run; it rethrows the
/// operation's first error (a kvstore::error) each time it is called. A default op is done.
class op {
 public:
  op() = default;
  explicit op(std::shared_ptr<detail::op_state> s) : s_(std::move(s)) {}

  /// Blocks until done; throws the operation's error, if any.
  void wait() const {
    if (!s_) return;
    if (s_->hurry && !s_->finished.load(std::memory_order_acquire)) s_->hurry->before_wait();
    if (s_->spin_us && !s_->finished.load(std::memory_order_acquire)) spin();
    std::unique_lock lk(s_->m);
    if (s_->hurry)
      wait_hurrying(lk);
    else
      s_->wait_done(lk);
    if (s_->error) std::rethrow_exception(s_->error);
  }
  /// True once done (successfully or not); never blocks.
  bool ready() const {
    if (!s_) return true;
    std::lock_guard lk(s_->m);
    return s_->remaining == 0;
  }
  /// An op that is already done.
  static op done() { return op{}; }

  /// An op that is done once this one is and `f(first error or nullptr)` has run: at once on
  /// this thread when this op is already done, else on the thread that completes it (so f must
  /// be short and must not wait for other ops). The new op's error is this op's, else what f
  /// threw. For work that finishes an op's result (compat/mxnet.hpp's row_sparse_pull scatters
  /// the rows it pulled into a full-shape output).
  template <class F>
  op then(F f) const {
    auto next = std::make_shared<detail::op_state>(1);
    if (s_) {  // waits on it like on this one
      next->spin_us = s_->spin_us;
      next->hurry = s_->hurry;
    }
    auto run = [next, f = std::move(f)](std::exception_ptr e) mutable {
      try {
        f(e);
      } catch (...) {
        if (!e) e = std::current_exception();
      }
      next->complete_part(e);
    };
    std::exception_ptr already;
    if (s_) {
      std::unique_lock lk(s_->m);
      if (s_->remaining != 0) {
        // Chained after the continuation the library may have set: both run, in that order.
        s_->then = [prev = std::move(s_->then), run](std::exception_ptr e) mutable {
          if (prev) prev(e);
          run(e);
        };
        return op(std::move(next));
      }
      already = s_->error;
    }
    run(already);
    return op(std::move(next));
  }

 private:
  // Polls for completion for up to spin_us before wait() sleeps: an answer that comes within it
  // is seen without waking this thread from sleep.
  // Sleeps until done, asking the store's hook again at a growing interval (1 ms to 64 ms): the
  // op's task may reach what the hook sends (a fused push) only after this wait began, on an
  // engine thread that ran late, and would then wait out the store's hold (fuse_time).
  void wait_hurrying(std::unique_lock<std::mutex>& lk) const {
    for (auto pause = std::chrono::milliseconds(1); s_->remaining != 0;
         pause = std::min(pause * 2, std::chrono::milliseconds(64))) {
      ++s_->sleepers;
      const bool done = s_->cv.wait_for(lk, pause, [&] { return s_->remaining == 0; });
      --s_->sleepers;
      if (done) return;
      lk.unlock();
      s_->hurry->before_wait();
      lk.lock();
    }
  }

  void spin() const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(s_->spin_us);
    do {
      for (int i = 0; i < 32; ++i) {
        if (s_->finished.load(std::memory_order_acquire)) return;
        std::this_thread::yield();
      }
    } while (std::chrono::steady_clock::now() < until);
  }

  std::shared_ptr<detail::op_state> s_;
};

}  // namespace kvstore
