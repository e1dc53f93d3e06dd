// What a batched request waits on (issue 12): a countdown per request that answers it once all
// its keys are done, reused entry after entry so that no key allocates a waiter, and what a run of
// a push frame's keys served on an apply pool thread leaves to the io thread. Plain bookkeeping:
// the shard's batched requests (server/batch.hpp) decide what waits and what is left.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/server/slice.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// Batched requests waiting for their keys (a sync round to complete, rank 0's init), each a
/// countdown that answers its request when it reaches 0, with the first error of its keys if
/// any. Entries are reused: none is allocated per key.
template <class Port>
class batch_waits {
 public:
  /// A countdown for request `req_id` of `port`, held open (it cannot reach 0) until the
  /// frame's keys are all queued: done(id) once more closes it.
  std::uint32_t open(const Port& port, std::uint64_t req_id) {
    std::uint32_t id = free_;
    if (id == no_batch) {
      id = static_cast<std::uint32_t>(e_.size());
      e_.emplace_back();
    } else {
      free_ = e_[id].next_free;
    }
    entry& e = e_[id];
    e.port = port;
    e.req_id = req_id;
    e.remaining = 1;
    e.status = errc::ok;
    e.message.clear();
    ++used_;
    return id;
  }
  /// `n` more keys of request `id` wait.
  void add(std::uint32_t id, std::uint64_t n = 1) { e_[id].remaining += n; }
  /// `keys` keys of request `id` are done (`status` ok, or its error: the first one is
  /// answered). The last answers the request through `sh.answer`.
  template <class Shard>
  void done(std::uint32_t id, errc status, const std::string& message, Shard& sh,
            std::uint64_t keys = 1) {
    entry& e = e_[id];
    if (status != errc::ok && e.status == errc::ok) {
      e.status = status;
      e.message = message;
    }
    if (e.remaining -= keys) return;
    Port port = std::move(e.port);
    e.port = Port{};
    const std::uint64_t req = e.req_id;
    const errc st = e.status;
    std::string msg = std::move(e.message);
    e.next_free = free_;
    free_ = id;
    --used_;
    sh.answer(port, req, st, std::move(msg));
  }
  /// Forgets request `id` unanswered (a frame about to be checked and served again).
  void drop(std::uint32_t id) {
    entry& e = e_[id];
    e.port = Port{};
    e.message.clear();
    e.next_free = free_;
    free_ = id;
    --used_;
  }
  /// Requests waiting.
  std::size_t size() const noexcept { return used_; }
  /// Forgets them all (the shard's slices were replaced).
  void clear() {
    e_.clear();
    free_ = no_batch;
    used_ = 0;
  }

 private:
  struct entry {
    Port port;
    std::uint64_t req_id = 0;
    std::uint64_t remaining = 0;
    errc status = errc::ok;
    std::string message;
    std::uint32_t next_free = no_batch;
  };
  std::vector<entry> e_;
  std::uint32_t free_ = no_batch;
  std::size_t used_ = 0;
};

/// What the pushes of a run of a batched frame's keys leave to the io thread when the run is
/// served on an apply pool thread (batch_ops::push): the changes to report, how many keys now
/// wait on the frame's countdown, and the waiters of the rounds that completed, answered on the
/// io thread once every run is done: those of batched requests counted per request (a run
/// completes thousands of rounds for the same two or three), the others one by one.
template <class Port>
struct pass_effects {
  std::uint64_t changes = 0;
  std::uint64_t waits = 0;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> batches;  // (request, keys done)
  std::vector<reply_to<Port>> answers;
  std::vector<std::int64_t> open_pushes;  // per worker: pushes put in open rounds, less closed

  /// Round waiter `w` is answered ok.
  void release(reply_to<Port>&& w) {
    if (w.batch == no_batch) return answers.push_back(std::move(w));
    for (auto& b : batches)
      if (b.first == w.batch) return void(++b.second);
    batches.emplace_back(w.batch, 1);
  }
};

}  // namespace kvstore::detail
