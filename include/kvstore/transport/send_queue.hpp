// The frames a connection has yet to write: highest priority first, and within one priority in
// the order queued. One first-in-first-out run per priority in use, kept sorted: pushing and
// popping a frame moves it once, where a binary heap of whole frames moved each one log(n) times
// (2.7% of a process pushing 1,000 keys in flight, issue 12). Most jobs use a handful of
// priorities, often one.
#pragma once

#include <kvstore/transport/out_frame.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvstore::transport {

class send_queue {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }

  /// Queues f behind every frame of its priority and every frame of a higher one.
  void push(out_frame f) {
    const std::int32_t p = f.h.priority;
    // The one run kept while the queue is empty takes whatever priority comes next.
    if (size_ == 0 && runs_.size() == 1) runs_.front().priority = p;
    auto it = std::lower_bound(runs_.begin(), runs_.end(), p,
                               [](const run& r, std::int32_t q) { return r.priority > q; });
    if (it == runs_.end() || it->priority != p) {
      it = runs_.insert(it, run{p, {}, 0});
    }
    it->push(std::move(f));
    ++size_;
  }

  /// The frame to write next (not empty()).
  out_frame& front() noexcept { return runs_.front().front(); }

  /// Drops front(). A drained run is dropped too unless it is the only one: a job with one
  /// priority keeps its run's storage from frame to frame.
  void pop() {
    runs_.front().pop();
    --size_;
    if (runs_.front().empty() && runs_.size() > 1) runs_.erase(runs_.begin());
  }

  /// Frame slots held, queued or reusable (bounded: a run that never drains holds at most
  /// about twice its queued frames).
  std::size_t slots() const noexcept {
    std::size_t n = 0;
    for (auto& r : runs_) n += r.frames.capacity();
    return n;
  }

  void clear() noexcept {
    runs_.clear();
    size_ = 0;
  }

 private:
  // One priority's frames: frames[head..] are queued; the popped prefix is reused once it is
  // half the storage (or everything), so a run that never drains does not grow without bound.
  struct run {
    std::int32_t priority;
    std::vector<out_frame> frames;
    std::size_t head;

    bool empty() const noexcept { return head == frames.size(); }
    out_frame& front() noexcept { return frames[head]; }
    void push(out_frame f) {
      if (head != 0 && frames.size() == frames.capacity() && 2 * head >= frames.size()) {
        frames.erase(frames.begin(), frames.begin() + static_cast<std::ptrdiff_t>(head));
        head = 0;
      }
      frames.push_back(std::move(f));
    }
    void pop() {
      frames[head] = out_frame{};  // frees what the frame holds (its meta, the payload's owner)
      if (++head == frames.size()) {
        frames.clear();
        head = 0;
      }
    }
  };

  std::vector<run> runs_;  // by priority, highest first
  std::size_t size_ = 0;
};

}  // namespace kvstore::transport
