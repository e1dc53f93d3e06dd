// Small one-key pushes fused across calls (issue 12): the layer-by-layer gradients of backprop
// are many pushes of small keys issued close together. While something is already in flight to
// a server, a small plain push to it waits (at most fuse_time, at most fuse_bytes together)
// and goes out with the others in one batch_push frame flagged flag_each, so the server still
// answers each key on its own, when that key's round completes: a key's op depends on no other
// key's round, as when it went alone. With nothing in flight the push goes at once (no added
// latency on an idle link). Per-key order is the engine's: a key's next op waits for this one.
// The frame's payload is the callers' values where they lie (out_frame::pieces), not a copy: a
// pushed buffer stays alive and unchanged until its op is done, as for a push sent alone.
#pragma once

#include <kvstore/client/batch.hpp>
#include <kvstore/client/call.hpp>
#include <kvstore/client/client.hpp>
#include <kvstore/client/key_record.hpp>
#include <kvstore/detail/block_pool.hpp>
#include <kvstore/op.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::detail {

// Shared, not owned by the store alone: the client's send hook holds it (the client and its io
// thread outlive the store's other parts), and a flush timer holds it weakly, so neither can
// reach a destroyed fusion while the store is torn down.
template <class T>
class fusion final : public wait_hook,
                     public worker_client::send_hook,
                     public std::enable_shared_from_this<fusion<T>> {
  static constexpr wire::dtype dtype = wire::dtype_of<T>();
  struct private_tag {};

 public:
  using done_fn = op_state::continuation;

  /// The fusion of client c's one-key pushes; while it is on, c runs its send hook.
  static std::shared_ptr<fusion> make(worker_client& c) {
    auto f = std::make_shared<fusion>(c, private_tag{});
    if (f->on_) c.set_before_send(f);
    return f;
  }
  fusion(worker_client& c, private_tag)
      : client_(c),
        on_(c.options().fuse_bytes > 0 && c.options().server_restart_wait.count() == 0),
        bytes_(c.options().fuse_bytes),
        time_(c.options().fuse_time),
        servers_(static_cast<std::size_t>(c.num_servers())) {}
  fusion(const fusion&) = delete;
  fusion& operator=(const fusion&) = delete;

  /// Takes the push of key m (small, plain, whole on server m.home: the caller checks) when it
  /// should wait for others, moving `done` out; false (done untouched) when it should go alone.
  bool push(key_record& m, std::span<const T> value, int priority, done_fn& done) {
    if (!on_ || m.home < 0) return false;
    const int s = m.home;
    auto& p = servers_[static_cast<std::size_t>(s)];
    std::unique_lock lk(m_);
    if (p.reqs.empty() && client_.in_flight(s) == 0) return false;
    const std::uint64_t seq = next_push_seq(*m.pushes);
    if (p.reqs.empty()) p.reserve_like_last();
    const std::size_t at = p.meta.size();
    p.meta.resize(at + wire::batch_entry_size);
    wire::put_batch_entry(p.meta.data() + at, wire::batch_entry{m.k.id(), value.size(), seq});
    p.pieces.push_back(std::as_bytes(value));
    p.values += value.size();
    worker_client::request r;
    r.done = make_pooled<op_state>(1, std::move(done));
    r.what = {call_kind::push, &m.k};
    p.reqs.push_back(std::move(r));
    waiting_.fetch_add(1, std::memory_order_release);
    p.priority = p.reqs.size() == 1 ? priority : std::max(p.priority, priority);
    if (p.meta.size() + p.values * sizeof(T) >= bytes_) {
      flush_locked(s, lk);  // unlocks
    } else if (!p.timer) {
      p.timer = true;
      client_.run_after(time_, [weak = this->weak_from_this(), s] {
        const auto self = weak.lock();
        if (!self) return;
        std::unique_lock l(self->m_);
        self->servers_[static_cast<std::size_t>(s)].timer = false;
        self->flush_locked(s, l);
      });
    }
    return true;
  }

  /// The hook a worker's ops carry (op_state::hurry) while fusion is on, else nullptr.
  wait_hook* hook() noexcept { return on_ ? this : nullptr; }
  /// A caller waits on an op that is not done (op::wait): what waits goes now.
  void before_wait() override { flush_all(); }
  /// Another request goes to server s (a pull, a push that is not fused, a batch): the pushes
  /// waiting for s go first, so no frame queued later overtakes them (nor, by priority, one of
  /// a lower priority). Nothing to lock while no push waits anywhere.
  void before_send(int s) override {
    if (none_waiting()) return;
    std::unique_lock lk(m_);
    flush_locked(s, lk);  // unlocks when it sends
  }

  /// Sends every server's waiting pushes now: for a caller about to wait for them (wait,
  /// wait_all, op::wait) and before a barrier, so none waits out fuse_time.
  void flush_all() {
    if (!on_ || none_waiting()) return;  // op::wait asks on every op not yet done
    for (std::size_t s = 0; s < servers_.size(); ++s) {
      std::unique_lock lk(m_);
      flush_locked(static_cast<int>(s), lk);  // unlocks when it sends
    }
  }

 private:
  // No push waits in any server's frame: nothing to send, no lock to take.
  bool none_waiting() const noexcept { return waiting_.load(std::memory_order_acquire) == 0; }

  struct pending {
    std::string meta;                                // the entries (wire::put_batch_entry)
    std::vector<std::span<const std::byte>> pieces;  // each key's value, in entry order
    std::size_t values = 0;                          // elements in pieces, together
    std::vector<worker_client::request> reqs;
    int priority = 0;
    bool timer = false;         // a flush is due within fuse_time
    std::size_t last_keys = 0;  // the previous frame's

    // A frame's lists sized before its first push, as the previous frame needed them: grown
    // push by push, its requests (a few hundred bytes each) were moved at each growth.
    void reserve_like_last() {
      meta.reserve(last_keys * wire::batch_entry_size);
      pieces.reserve(last_keys);
      reqs.reserve(last_keys);
    }
  };

  // Sends server s's waiting pushes as one frame (m_ held by lk, released before sending).
  void flush_locked(int s, std::unique_lock<std::mutex>& lk) {
    auto& p = servers_[static_cast<std::size_t>(s)];
    if (p.reqs.empty()) return;
    const std::size_t keys = p.reqs.size();
    p.last_keys = keys;
    transport::out_frame f;
    f.h = wire::batch_header(wire::cmd::batch_push, dtype, keys, p.values, p.priority,
                             /*has_data=*/false, /*each=*/true);
    f.payload_len = p.values * sizeof(T);
    f.pieces = std::move(p.pieces);
    f.meta = std::move(p.meta);
    std::vector<worker_client::request> reqs = std::move(p.reqs);
    waiting_.fetch_sub(keys, std::memory_order_release);
    p.meta.clear();
    p.pieces.clear();
    p.values = 0;
    p.reqs.clear();
    // Sent without the lock: a refused send completes the ops here, and a completion may run a
    // key's next push, which comes back to push(). Two frames to one server may then leave in
    // either order; no key is in both (its next push waits for this one's answer).
    lk.unlock();
    client_.send_each(s, std::move(f), std::move(reqs));
  }

  worker_client& client_;
  const bool on_;
  const std::size_t bytes_;
  const std::chrono::microseconds time_;
  std::mutex m_;
  std::vector<pending> servers_;
  std::atomic<std::size_t> waiting_{0};  // pushes in servers_, together (changed under m_)
};

}  // namespace kvstore::detail
