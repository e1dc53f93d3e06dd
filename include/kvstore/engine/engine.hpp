// The engine: per-key FIFO of ops, a ready queue ordered by (priority desc, sequence asc), and a
// small thread pool that runs ready ops. Tasks may complete later (from another thread, e.g. when
// a server answers): the next op on the same key starts only once the previous one completed.
#pragma once

#include <kvstore/op.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <vector>

namespace kvstore::detail {

class engine {
 public:
  /// Called exactly once by a task when its work is finished (nullptr on success).
  using done_fn = std::function<void(std::exception_ptr)>;
  /// A task: does its work, then (now or later, from any thread) calls done exactly once.
  /// A task that throws before calling done is treated as done with that exception.
  using task_fn = std::function<void(done_fn)>;

  explicit engine(unsigned threads = 0) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    threads_.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  /// Waits for every issued op, then stops the threads.
  ~engine() {
    wait_all();
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  unsigned size() const noexcept { return static_cast<unsigned>(threads_.size()); }

  /// Queues `task` behind every earlier op on `key`; `part` is completed with the task's result.
  /// With `may_run_inline`, a task whose key is idle, while no other op waits for a thread and a
  /// pool thread is idle (so it would start at once anyway), runs on the calling thread: no
  /// hand-off, no wake-up. For short tasks (small copies, queuing network frames).
  void submit(std::uint64_t key, int priority, task_fn task, std::shared_ptr<op_state> part,
              bool may_run_inline = false) {
    std::unique_lock lk(m_);
    item it{priority, seq_++, key, std::move(task), std::move(part)};
    ++in_flight_;
    auto& q = keys_[key];
    ++q.issued;
    if (q.busy) {
      q.pending.push_back(std::move(it));
      return;
    }
    q.busy = true;
    if (may_run_inline && ready_.empty() && idle_ > 0) {
      lk.unlock();
      execute(std::move(it));
      return;
    }
    ready_.push(std::move(it));
    lk.unlock();
    cv_.notify_one();
  }

  /// Convenience: a synchronous task.
  void submit_sync(std::uint64_t key, int priority, std::function<void()> f,
                   std::shared_ptr<op_state> part, bool may_run_inline = false) {
    submit(
        key, priority,
        [f = std::move(f)](const done_fn& done) {
          f();
          done(nullptr);
        },
        std::move(part), may_run_inline);
  }

  /// Every op issued on `key` before this call is done.
  void wait_key(std::uint64_t key) {
    std::unique_lock lk(m_);
    auto it = keys_.find(key);
    if (it == keys_.end()) return;
    const std::uint64_t target = it->second.issued;
    ++key_waiters_;
    idle_cv_.wait(lk, [&] {
      auto j = keys_.find(key);
      return j == keys_.end() || j->second.completed >= target;
    });
    --key_waiters_;
  }

  /// Every op issued so far is done.
  void wait_all() {
    std::unique_lock lk(m_);
    idle_cv_.wait(lk, [&] { return in_flight_ == 0; });
  }

  /// Runs f(begin, end) over [0, n) in chunks of at least `grain`, on the pool's threads and the
  /// calling thread together. The caller claims chunks too, so this never deadlocks even when
  /// called from a pool thread while all others are busy.
  template <class F>
  void parallel_for(std::size_t n, std::size_t grain, F&& f) {
    if (n == 0) return;
    // Several chunks per pool thread, claimed as threads come free: the split stays even when
    // the caller is one of the pool's threads (then one chunk per thread would leave a spare
    // chunk to one of them) or when another thread is slow to wake.
    const std::size_t want = 4 * std::max(1u, size());
    std::size_t chunks =
        std::min<std::size_t>(want, (n + grain - 1) / std::max<std::size_t>(grain, 1));
    if (chunks <= 1) {
      f(std::size_t{0}, n);
      return;
    }
    auto job = std::make_shared<pjob>();
    job->n = n;
    job->chunks = chunks;
    job->body = [&f](std::size_t b, std::size_t e) { f(b, e); };
    {
      std::lock_guard lk(m_);
      for (std::size_t i = 1; i < chunks; ++i) helpers_.push_back(job);
    }
    cv_.notify_all();
    job->work();
    std::unique_lock lk(job->m);
    job->cv.wait(lk, [&] { return job->finished == job->chunks; });
  }

 private:
  struct item {
    int priority;
    std::uint64_t seq;
    std::uint64_t key;
    task_fn task;
    std::shared_ptr<op_state> part;
  };
  // Strict weak order: higher priority first, then lower sequence (issue order) first.
  struct item_less {
    bool operator()(const item& a, const item& b) const noexcept {
      if (a.priority != b.priority) return a.priority < b.priority;
      return a.seq > b.seq;
    }
  };
  struct key_queue {
    std::deque<item> pending;
    bool busy = false;
    std::uint64_t issued = 0;
    std::uint64_t completed = 0;
  };
  struct pjob {
    std::size_t n = 0, chunks = 0;
    std::atomic<std::size_t> next{0};
    std::function<void(std::size_t, std::size_t)> body;
    std::mutex m;
    std::condition_variable cv;
    std::size_t finished = 0;
    void work() {
      for (;;) {
        std::size_t c = next.fetch_add(1);
        if (c >= chunks) return;
        std::size_t b = n * c / chunks, e = n * (c + 1) / chunks;
        body(b, e);
        std::lock_guard lk(m);
        if (++finished == chunks) cv.notify_all();
      }
    }
  };

  void run() {
    std::unique_lock lk(m_);
    for (;;) {
      ++idle_;
      cv_.wait(lk, [&] { return stop_ || !ready_.empty() || !helpers_.empty(); });
      --idle_;
      if (!helpers_.empty()) {
        auto job = std::move(helpers_.back());
        helpers_.pop_back();
        lk.unlock();
        job->work();
        lk.lock();
        continue;
      }
      if (ready_.empty()) {
        if (stop_) return;
        continue;
      }
      item it = std::move(const_cast<item&>(ready_.top()));
      ready_.pop();
      lk.unlock();
      execute(std::move(it));
      lk.lock();
    }
  }

  void execute(item it) {
    auto called = std::make_shared<std::atomic<bool>>(false);
    const std::uint64_t key = it.key;
    auto part = it.part;
    done_fn done = [this, key, part, called](std::exception_ptr e) {
      if (called->exchange(true)) return;  // a task may only complete once
      // The op is done before the key moves on, so op::wait() never returns after wait_all().
      if (part) part->complete_part(e);
      finish(key);
    };
    try {
      it.task(done);
    } catch (...) {
      done(std::current_exception());
    }
  }

  // The op on `key` finished: start the next one queued on it.
  void finish(std::uint64_t key) {
    bool notify = false;
    bool wake_waiters = false;
    {
      std::lock_guard lk(m_);
      auto it = keys_.find(key);
      auto& q = it->second;
      ++q.completed;
      if (!q.pending.empty()) {
        ready_.push(std::move(q.pending.front()));
        q.pending.pop_front();
        notify = true;
      } else {
        keys_.erase(it);
      }
      --in_flight_;
      // Only a wait that can now be satisfied is woken: wait_all once nothing is in flight, and
      // wait_key (per-key counts) whenever one is waiting. Waking a wait_all per finished op
      // would bounce its thread once per op.
      wake_waiters = in_flight_ == 0 || key_waiters_ > 0;
    }
    if (notify) cv_.notify_one();
    if (wake_waiters) idle_cv_.notify_all();
  }

  std::mutex m_;
  std::condition_variable cv_;       // work for the pool
  std::condition_variable idle_cv_;  // ops completed
  std::priority_queue<item, std::vector<item>, item_less> ready_;
  std::unordered_map<std::uint64_t, key_queue> keys_;
  std::vector<std::shared_ptr<pjob>> helpers_;
  std::uint64_t seq_ = 0;
  std::size_t in_flight_ = 0;
  unsigned idle_ = 0;            // pool threads waiting for work
  std::size_t key_waiters_ = 0;  // threads in wait_key
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvstore::detail
