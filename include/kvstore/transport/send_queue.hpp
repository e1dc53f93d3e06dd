// The frames a connection has yet to write: highest priority first, and within one priority in
// the order queued. One first-in-first-out run per priority in use, kept sorted: pushing and
// popping a frame moves it once, where a binary heap of whole frames moved each one log(n) times
// (2.7% of a process pushing 1,000 keys in flight, issue 12). Most jobs use a handful of
// priorities, often one.
// A server's answers to pushes (wire::acks_header: ok, for requests first .. first + n - 1)
// merge here: one queued right behind another whose ids it continues extends it instead of
// queuing a frame. What the io thread has not written yet goes out as one answer, so a worker
// with many pushes in flight reads and takes one frame for many (issue 12).
#pragma once

#include <kvstore/transport/out_frame.hpp>
#include <kvstore/wire/frame.hpp>

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

  /// Queues f behind every frame of its priority and every frame of a higher one. Returns
  /// false when f was merged into the frame before it (both acks whose ids follow on), so
  /// nothing more waits.
  bool push(out_frame&& f) {
    const std::int32_t p = f.h.priority;
    // The one run kept while the queue is empty takes whatever priority comes next.
    if (size_ == 0 && runs_.size() == 1) runs_.front().priority = p;
    auto it = run_at(p);
    if (it == runs_.end() || it->priority != p) {
      it = runs_.insert(it, run{p, {}, 0});
    }
    if (it->merges(f)) return false;
    it->push(std::move(f));
    ++size_;
    return true;
  }

  /// Extends the acks queued last at h's priority when h (an acks header: wire::is_acks) continues
  /// them; false when it does not, and h needs a frame of its own. A server answering many
  /// pushes of one read so builds one frame for them, not a frame each to merge.
  bool extend_acks(const wire::header& h) noexcept {
    auto it = run_at(h.priority);
    return it != runs_.end() && it->priority == h.priority && it->merges(h, false);
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
    // f continues the acks queued last: extend them (headers already checked by is_acks, with
    // the payload and text sizes the connection set from the frame).
    bool merges(const out_frame& f) noexcept { return merges(f.h, f.keep != nullptr); }
    bool merges(const wire::header& h, bool kept) noexcept {
      if (empty() || !wire::is_acks(h) || kept) return false;
      wire::header& last = frames.back().h;
      if (!wire::is_acks(last) || last.sender != h.sender || frames.back().keep ||
          last.req_id + last.aux != h.req_id || last.aux > ~std::uint64_t{0} - h.aux)
        return false;
      last.aux += h.aux;
      return true;
    }
    out_frame& front() noexcept { return frames[head]; }
    void push(out_frame&& f) {
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

  // The run of priority p, or where it would go.
  std::vector<run>::iterator run_at(std::int32_t p) {
    return std::lower_bound(runs_.begin(), runs_.end(), p,
                            [](const run& r, std::int32_t q) { return r.priority > q; });
  }

  std::vector<run> runs_;  // by priority, highest first
  std::size_t size_ = 0;
};

}  // namespace kvstore::transport
