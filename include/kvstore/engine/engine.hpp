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
#pragma once

#include <kvstore/detail/block_pool.hpp>
#include <kvstore/detail/prefetch.hpp>
#include <kvstore/engine/key_slot.hpp>
#include <kvstore/op.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <span>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// Called exactly once by a task when its work is finished (nullptr on success).
using engine_done_fn = std::function<void(std::exception_ptr)>;
/// A task: does its work, then (now or later, from any thread) calls done exactly once.
using engine_task_fn = std::function<void(engine_done_fn)>;

/// What a pipelined one-key op's task learns of its run and may answer. behind_stream: an earlier
/// op of its key is still on the wire. held_back: set by the task when it left its request
/// waiting instead of queuing it on a connection (small-key fusion, client/fusion.hpp); its key
/// then waits for its answer, as a non-pipelined op's does, so no later op of the key overtakes
/// it.
struct pipelined_run {
  bool behind_stream = false;
  bool held_back = false;
};

/// One queued op: the op state it completes, and its keys' links; its task is engine_op_of's.
struct engine_op {
  engine_op(int p, std::shared_ptr<op_state> s) : priority(p), part(std::move(s)) {}
  virtual ~engine_op() = default;
  // Made on the caller's thread, freed on whichever completes it (detail/block_pool.hpp).
  static void* operator new(std::size_t n) { return block_pool::allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept { block_pool::deallocate(p, n); }
  /// Runs the task (once).
  virtual void run(const engine_done_fn& done) = 0;
  /// Drops the task and what it captured (the op may complete much later).
  virtual void drop_task() noexcept = 0;
  int priority;
  std::uint64_t seq = 0;
  std::shared_ptr<op_state> part;
  std::size_t waiting = 0;  // keys it is queued on and does not hold yet
  std::uint64_t id = 0;     // with by_id: the key of the engine's own table it is queued on
  bool by_id = false;       // (that slot is dropped once idle)
  key_link one;             // the link of a one-key op
  std::unique_ptr<key_link[]> many;  // the links of a many-key op
  std::size_t keys = 1;
  bool pipelined = false;           // lets its keys go when its task returns (submit_pipelined)
  key_hold* hold = nullptr;         // a many-key op's: its keys go free lazily (key_slot.hpp)
  bool passed = false;              // let its keys go (engine lock)
  pipelined_run run_info;           // behind_stream set when it takes its key (engine lock)
  std::atomic<int> refs{2};         // the running task and its done: freed after both
  std::atomic<bool> called{false};  // done ran (a task may only complete once)
  key_link* links() noexcept { return many ? many.get() : &one; }
};

/// An op with its task inside: one block per op, where a std::function task was a second one
/// (for a capture of more than two pointers) that the caller's thread allocated and whichever
/// thread completed the op freed (issue 12: a one-key op's blocks).
template <class Task>
struct engine_op_of final : engine_op {
  static_assert(alignof(Task) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                "the block pool aligns as operator new does");
  engine_op_of(int p, Task t, std::shared_ptr<op_state> s)
      : engine_op(p, std::move(s)), task(std::move(t)) {}
  void run(const engine_done_fn& done) override {
    if constexpr (std::is_invocable_v<Task&, const engine_done_fn&, pipelined_run&>)
      (*task)(done, run_info);
    else
      (*task)(done);
  }
  void drop_task() noexcept override { task.reset(); }
  std::optional<Task> task;
};

class engine {
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
  // Strict weak order: higher priority first, then lower sequence (issue order) first.
  struct op_less {
    bool operator()(const engine_op* a, const engine_op* b) const noexcept {
      if (a->priority != b->priority) return a->priority < b->priority;
      return a->seq > b->seq;
    }
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
      engine_op* op = ready_.top();
      ready_.pop();
      lk.unlock();
      execute(op);
      lk.lock();
    }
  }

  // Whether `op` may take `slot` when no op holds it: once none streams, or, pipelined, behind
  // fewer than max_pipeline_ of its own priority (a connection keeps only their order).
  bool may_take(const engine_op* op, const key_slot& slot) const noexcept {
    return slot.streaming == 0 || (op->pipelined && slot.streaming < max_pipeline_ &&
                                   op->priority == slot.stream_priority);
  }

  // Queues `op` on `slot` through `link` (m_ held): it holds the key at once when it is free,
  // else waits behind the ops queued before it.
  void enqueue(engine_op* op, key_slot& slot, key_link& link) {
    link.op = op;
    link.slot = &slot;
    link.next = nullptr;
    settle(slot);
    ++slot.issued;
    if (!slot.held && !slot.head && may_take(op, slot)) {  // free: the op holds it now
      take(op, slot);
      return;
    }
    if (slot.lazy) slot.lazy->waited = true;  // its finish lets this op in
    if (slot.tail)
      slot.tail->next = &link;
    else
      slot.head = &link;
    slot.tail = &link;
    ++op->waiting;
  }

  // `op` holds `slot` now (m_ held); through its hold, if it has one.
  static void take(engine_op* op, key_slot& slot) {
    op->run_info.behind_stream = slot.streaming > 0;
    slot.held = true;
    if (!op->hold) return;
    slot.lazy = op->hold;
    ++op->hold->keys;
    if (slot.head) op->hold->waited = true;  // ops wait behind it
  }

  // A key held through the hold of a many-key op that is done goes free now (m_ held).
  void settle(key_slot& slot) {
    key_hold* h = slot.lazy;
    if (!h || !h->done) return;
    slot.lazy = nullptr;
    slot.held = false;
    ++slot.completed;
    if (--h->keys == 0) unlink_hold(h);
  }

  // An op over exactly the keys of a done hold that every one of them still names (none was
  // touched since: an op queued on a key, or a wait on it, settles it and lowers the count) and
  // no op waited behind takes them all through that hold, made not done again, without reading
  // or writing any key's slot (m_ held). Queuing it would have given it every key at once too.
  // Each key's one unsettled op then stands for this one: busy() and wait_slot see an op in
  // flight until this one is done. Not while a wait_slot waits: it read its target before, and
  // would wait for this op too (a stream of renewals could keep it waiting).
  bool renew(engine_op* op, std::span<key_slot* const> slots) {
    key_hold* h = slots.front()->lazy;
    if (!h || !h->done || h->waited || key_waiters_ != 0 || h->keys != slots.size() ||
        !std::equal(slots.begin(), slots.end(), h->slots.begin(), h->slots.end()))
      return false;
    h->done = false;
    op->hold = h;
    key_link* links = op->links();  // for finish's walk, should an op queue behind this one
    for (std::size_t i = 0; i < slots.size(); ++i) {
      links[i].op = op;
      links[i].slot = slots[i];
    }
    return true;
  }

  key_hold* new_hold() {
    auto* h = new key_hold;
    h->next = holds_;
    if (holds_) holds_->prev = h;
    holds_ = h;
    return h;
  }
  void unlink_hold(key_hold* h) noexcept {
    (h->prev ? h->prev->next : holds_) = h->next;
    if (h->next) h->next->prev = h->prev;
    delete h;
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

  // The key is not held (m_ held): its first waiting op takes it if it may. Returns whether an
  // op became ready.
  bool advance(key_slot& slot) {
    key_link* next = slot.head;
    if (slot.held || !next || !may_take(next->op, slot)) return false;
    slot.head = next->next;
    if (!slot.head) slot.tail = nullptr;
    take(next->op, slot);
    if (--next->op->waiting) return false;
    ready_.push(next->op);
    return true;
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
  std::condition_variable cv_;       // work for the pool
  std::condition_variable idle_cv_;  // ops completed
  std::priority_queue<engine_op*, std::vector<engine_op*>, op_less> ready_;
  std::unordered_map<std::uint64_t, key_slot> keys_;  // the queues of keys submitted by id
  std::vector<std::shared_ptr<pjob>> helpers_;
  key_hold* holds_ = nullptr;  // the live holds of many-key ops (key_slot.hpp)
  std::uint64_t seq_ = 0;
  std::size_t in_flight_ = 0;
  unsigned idle_ = 0;            // pool threads waiting for work
  std::size_t key_waiters_ = 0;  // threads in wait_key
  std::uint16_t max_pipeline_ = 16;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvstore::detail
