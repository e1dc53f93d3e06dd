// The engine: per-key FIFO of ops, a ready queue ordered by (priority desc, sequence asc), and a
// small thread pool that runs ready ops. Tasks may complete later (from another thread, e.g. when
// a server answers): the next op on the same key starts only once the previous one completed.
// An op may span many keys (a batched multi-key call): it is queued on each key and runs once
// it holds them all, so per-key issue order holds across batched and single-key ops.
// A pipelined op (a request whose order the connection keeps) lets its key go as soon as its task
// returns, not when it completes: back-to-back ops on one key stream instead of waiting a round
// trip each (unless its task held its request back: pipelined_run). Ops that are not pipelined
// wait until no op of their key streams.
// An op over many keys that no later op waits behind lets its keys go lazily: its finish marks
// it done, and each key goes free when next touched (engine/key_slot.hpp's key_hold); the next
// op over exactly those keys, none touched since, renews that hold and touches none of them.
// The ops are engine/engine_op.hpp's; who holds which key is engine/key_queues.hpp's bookkeeping;
// this file is the pool, its locking and waits, and parallel_for.
#pragma once

#include <kvstore/detail/prefetch.hpp>
#include <kvstore/engine/engine_op.hpp>
#include <kvstore/engine/key_queues.hpp>
#include <kvstore/engine/key_slot.hpp>
#include <kvstore/op.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

class engine : private key_queues {
 public:
  /// Called exactly once by a task when its work is finished (nullptr on success).
  using done_fn = engine_done_fn;
  /// A task: does its work, then (now or later, from any thread) calls done exactly once.
  /// A task that throws before calling done is treated as done with that exception.
  using task_fn = engine_task_fn;

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
    while (holds_) unlink_hold(holds_);  // done, named by keys never touched again
  }

  unsigned size() const noexcept { return static_cast<unsigned>(threads_.size()); }

  /// Queues `task` behind every earlier op on `key`; `part` is completed with the task's result.
  /// With `may_run_inline`, a task whose key is idle, while no other op waits for a thread and a
  /// pool thread is idle (so it would start at once anyway), runs on the calling thread: no
  /// hand-off, no wake-up. For short tasks (small copies, queuing network frames).
  /// A task is any callable taking a done_fn (a task_fn, or a lambda kept in the op itself).
  template <class Task>
  void submit(std::uint64_t key, int priority, Task&& task, std::shared_ptr<op_state> part,
              bool may_run_inline = false) {
    engine_op* op = make_op(priority, std::forward<Task>(task), std::move(part));
    std::unique_lock lk(m_);
    op->by_id = true;
    op->id = key;
    enqueue(op, keys_[key], op->one);
    start(op, lk, may_run_inline);
  }

  /// The same on a key whose queue the caller keeps (a key's record): `slot` must outlive the
  /// engine's use of it (every op issued on it done).
  template <class Task>
  void submit(key_slot& slot, int priority, Task&& task, std::shared_ptr<op_state> part,
              bool may_run_inline = false) {
    engine_op* op = make_op(priority, std::forward<Task>(task), std::move(part));
    std::unique_lock lk(m_);
    enqueue(op, slot, op->one);
    start(op, lk, may_run_inline);
  }

  /// The most pipelined ops of one key past it and not done (the next waits for the oldest);
  /// set before ops are submitted.
  void set_max_pipeline(std::uint32_t n) noexcept {
    max_pipeline_ = static_cast<std::uint16_t>(std::clamp<std::uint32_t>(n, 1, 0xffff));
  }

  /// As submit on `slot`, for a task that returns once its requests are written, in order, to
  /// the connections that keep their order (or queued for them): the key then goes to the next
  /// op while this one waits for its answer. The next op streams behind it if it is pipelined
  /// and of the same priority (a connection sends higher priorities first); any other waits
  /// until no op of the key streams. At most set_max_pipeline(n) ops of a key stream at once.
  /// `part` completes, and wait_slot/wait_all count the op, when the task calls done.
  template <class Task>
  void submit_pipelined(key_slot& slot, int priority, Task&& task, std::shared_ptr<op_state> part,
                        bool may_run_inline = false) {
    engine_op* op = make_op(priority, std::forward<Task>(task), std::move(part));
    op->pipelined = true;
    std::unique_lock lk(m_);
    enqueue(op, slot, op->one);
    start(op, lk, may_run_inline);
  }

  /// One op over many keys (distinct slots): it runs once every earlier op on each of them is
  /// done, and every later op on any of them waits for it. Ops across keys are ordered by their
  /// priority; between them and one-key ops on the same keys, issue order holds.
  template <class Task>
  void submit(std::span<key_slot* const> slots, int priority, Task&& task,
              std::shared_ptr<op_state> part, bool may_run_inline = false) {
    engine_op* op = make_op(priority, std::forward<Task>(task), std::move(part));
    if (slots.size() != 1) {
      op->many = std::make_unique<key_link[]>(slots.size());
      op->keys = slots.size();
    }
    key_link* links = op->links();
    std::unique_lock lk(m_);
    if (slots.size() >= lazy_release_keys) {
      if (renew(op, slots)) return start(op, lk, may_run_inline);
      op->hold = new_hold();
      op->hold->slots.assign(slots.begin(), slots.end());
    }
    for (std::size_t i = 0; i < slots.size(); ++i) {
      // A batch's slots lie in records all over memory: start loading a few ahead.
      if (i + prefetch_ahead < slots.size()) prefetch_for_write(slots[i + prefetch_ahead]);
      enqueue(op, *slots[i], links[i]);
    }
    start(op, lk, may_run_inline);
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
    const std::uint32_t target = it->second.issued;
    ++key_waiters_;
    idle_cv_.wait(lk, [&] {
      auto j = keys_.find(key);
      return j == keys_.end() || j->second.completed_up_to(target);
    });
    --key_waiters_;
  }

  /// Every op issued on the caller's `slot` before this call is done.
  void wait_slot(key_slot& slot) {
    std::unique_lock lk(m_);
    const std::uint32_t target = slot.issued;
    auto done = [&] {
      settle(slot);  // a done many-key op's hold counts as completed only once let go
      return slot.completed_up_to(target);
    };
    if (done()) return;
    ++key_waiters_;
    idle_cv_.wait(lk, done);
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
      engine_op* op = ready_.top();
      ready_.pop();
      lk.unlock();
      execute(op);
      lk.lock();
    }
  }

  // `op` is queued on all its keys (m_ held): it runs now when it holds them all.
  void start(engine_op* op, std::unique_lock<std::mutex>& lk, bool may_run_inline) {
    op->seq = seq_++;
    ++in_flight_;
    if (op->waiting) return;
    if (may_run_inline && ready_.empty() && idle_ > 0) {
      lk.unlock();
      execute(op);
      return;
    }
    ready_.push(op);
    lk.unlock();
    cv_.notify_one();
  }

  void execute(engine_op* op) {
    done_fn done = [this, op](std::exception_ptr e) {
      if (op->called.exchange(true)) return;  // a task may only complete once
      // The op is done before its keys move on, so op::wait() never returns after wait_all().
      if (op->part) op->part->complete_part(e);
      finish(op);
      release(op);
    };
    try {
      op->run(done);
    } catch (...) {
      done(std::current_exception());
    }
    op->drop_task();  // what it captured goes now, as the op may complete much later
    if (op->pipelined && !op->run_info.held_back) let_go(op);
    release(op);
  }

  // A pipelined op's task returned: its requests are on their way, in order, so its key goes to
  // the next op (unless the op is done already: finish did that).
  void let_go(engine_op* op) {
    bool notify = false;
    {
      std::lock_guard lk(m_);
      if (op->passed) return;
      op->passed = true;
      key_slot& slot = *op->one.slot;
      slot.held = false;
      slot.stream_priority = op->priority;
      ++slot.streaming;
      notify = advance(slot);
    }
    if (notify) cv_.notify_one();
  }

  template <class Task>
  static engine_op* make_op(int priority, Task&& task, std::shared_ptr<op_state> part) {
    return new engine_op_of<std::decay_t<Task>>(priority, std::forward<Task>(task),
                                                std::move(part));
  }

  static void release(engine_op* op) {
    if (op->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete op;
  }

  // `op` finished: each of its keys goes to the next op queued on it. When that makes exactly
  // one op ready and it is pipelined (a short task that only queues requests), it runs here, on
  // the thread that completed `op` (a worker's io thread reading the answer): a key streaming
  // past pipeline_depth then takes one op in per answer without waking a pool thread for each,
  // which cost more CPU than the task itself. Not from inside such a run (a task that completes
  // at once would chain them without bound), and not past ops already waiting for a thread.
  void finish(engine_op* op) {
    bool notify = false;
    bool wake_waiters = false;
    engine_op* run_here = nullptr;
    {
      std::lock_guard lk(m_);
      const bool none_ready = ready_.empty();
      key_link* links = op->links();
      const bool streamed = op->passed;  // a pipelined op whose task let its key go already
      op->passed = true;
      key_hold* hold = op->hold;
      if (hold) hold->done = true;  // no op waits behind it: each key goes free when next touched
      const std::size_t walk = hold && !hold->waited ? 0 : op->keys;
      for (std::size_t i = 0; i < walk; ++i) {
        if (i + prefetch_ahead < op->keys) prefetch_for_write(links[i + prefetch_ahead].slot);
        key_slot& slot = *links[i].slot;
        if (hold) {
          settle(slot);  // through its hold: completed, let go (the last key frees the hold)
        } else {
          ++slot.completed;
          if (streamed)
            --slot.streaming;
          else
            slot.held = false;
        }
        notify = advance(slot) || notify;
        if (op->by_id && !slot.held && !slot.head)  // idle: the engine's own queue of it goes
          keys_.erase(op->id);
      }
      --in_flight_;
      // Only a wait that can now be satisfied is woken: wait_all once nothing is in flight, and
      // wait_key (per-key counts) whenever one is waiting. Waking a wait_all per finished op
      // would bounce its thread once per op.
      wake_waiters = in_flight_ == 0 || key_waiters_ > 0;
      // (ready_ was empty and now holds one op: this finish made it ready.)
      if (none_ready && ready_.size() == 1 && ready_.top()->pipelined && running_here_ == 0 &&
          !stop_) {
        run_here = ready_.top();
        ready_.pop();
        notify = false;
      }
    }
    if (notify) cv_.notify_one();
    if (wake_waiters) idle_cv_.notify_all();
    if (run_here) {
      ++running_here_;
      execute(run_here);
      --running_here_;
    }
  }

  // Pipelined ops this thread runs from finish (0 or 1: such a run does not start another).
  static inline thread_local int running_here_ = 0;

  // An op over at least this many keys lets them go lazily (key_hold): below, its finish's walk
  // costs less than the hold's allocation.
  static constexpr std::size_t lazy_release_keys = 256;

  // How many keys ahead an op over many keys prefetches their slots.
  static constexpr std::size_t prefetch_ahead = 8;

  std::mutex m_;
  std::condition_variable cv_;                        // work for the pool
  std::condition_variable idle_cv_;                   // ops completed
  std::unordered_map<std::uint64_t, key_slot> keys_;  // the queues of keys submitted by id
  std::vector<std::shared_ptr<pjob>> helpers_;
  std::uint64_t seq_ = 0;
  std::size_t in_flight_ = 0;
  unsigned idle_ = 0;  // pool threads waiting for work
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvstore::detail
