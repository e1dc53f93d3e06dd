// The engine's op: what queues on a key and runs on the pool. Its own header so that what
// names an op (a key's queue, engine/key_slot.hpp; the bookkeeping, engine/key_queues.hpp) needs
// no thread pool, and so that a store's task types (pipelined_run) come without the engine.
#pragma once

#include <kvstore/detail/block_pool.hpp>
#include <kvstore/engine/key_slot.hpp>
#include <kvstore/op.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

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

}  // namespace kvstore::detail
