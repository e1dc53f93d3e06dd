// How an op learns that its device work is done without a host thread waiting on the device per
// op: after issuing, the store records an event on the op's stream and hands it here; one poller
// thread per store watches the oldest event of each stream (cudaEventQuery, never blocking a
// stream the way a host callback does) and completes the op's part when it has passed.
// On the OMP build the work is done when issued, so parts complete at once.
#pragma once

#include <kvstore/device/runtime.hpp>
#include <kvstore/fwd.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvstore::detail {

class completion_queue {
 public:
  completion_queue() = default;
  completion_queue(const completion_queue&) = delete;
  completion_queue& operator=(const completion_queue&) = delete;
  /// Waits until every part handed in has completed, then stops the poller.
  ~completion_queue() {
#if KVSTORE_DEVICE_CUDA
    drain();
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (poller_.joinable()) poller_.join();
    for (auto& [dev, pool] : pool_)
      for (auto e : pool) rt::event_destroy(e);
#endif
  }

  /// One part of `st` completes once the work issued on stream s (of device dev) so far is done.
  /// Call with dev current. Throws kvstore::error(device_error) if the event cannot be recorded.
  void add(int dev, rt::stream_t s, const std::shared_ptr<op_state>& st) {
#if KVSTORE_DEVICE_CUDA
    rt::event_t e = take_event(dev);
    try {
      rt::event_record(e, s);
    } catch (...) {
      give_back(dev, e);
      throw;
    }
    {
      std::lock_guard lk(m_);
      queues_[s].push_back({e, dev, st});
      ++pending_;
      if (!poller_.joinable()) poller_ = std::thread([this] { poll(); });
    }
    cv_.notify_one();
#else
    (void)dev;
    (void)s;
    st->complete_part();
#endif
  }

  /// Returns once every part handed in before the call has completed.
  void drain() {
#if KVSTORE_DEVICE_CUDA
    std::unique_lock lk(m_);
    drained_.wait(lk, [&] { return pending_ == 0; });
#endif
  }

 private:
#if KVSTORE_DEVICE_CUDA
  struct item {
    rt::event_t ev;
    int dev;
    std::shared_ptr<op_state> st;
  };

  rt::event_t take_event(int dev) {
    {
      std::lock_guard lk(m_);
      auto& p = pool_[dev];
      if (!p.empty()) {
        auto e = p.back();
        p.pop_back();
        return e;
      }
    }
    return rt::event_create(dev);
  }
  void give_back(int dev, rt::event_t e) {
    std::lock_guard lk(m_);
    pool_[dev].push_back(e);
  }

  // Completes, in each stream's order, every part whose event has passed; spins (yielding) while
  // work is pending, sleeps when none is.
  void poll() {
    std::vector<item> done;
    unsigned idle_polls = 0;
    std::unique_lock lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || pending_ > 0; });
      if (stop_ && pending_ == 0) return;
      done.clear();
      for (auto& [s, q] : queues_) {
        while (!q.empty()) {
          const cudaError_t r = cudaEventQuery(reinterpret_cast<cudaEvent_t>(q.front().ev));
          if (r == cudaErrorNotReady) break;
          done.push_back(std::move(q.front()));
          q.pop_front();
          if (r != cudaSuccess) {
            (void)cudaGetLastError();
            done.back().st->complete_part(std::make_exception_ptr(
                error(errc::device_error,
                      std::string("kvstore: device ") + std::to_string(done.back().dev) +
                          ": the op's device work failed: " + cudaGetErrorString(r))));
            done.back().st.reset();
          }
        }
      }
      if (done.empty()) {
        // Each query takes the driver's lock, which the threads issuing work need too: after a
        // run of empty polls, back off a little.
        lk.unlock();
        if (++idle_polls < 64)
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        lk.lock();
        continue;
      }
      idle_polls = 0;
      // Parts complete before pending_ drops, so after drain() every op handed in is done.
      lk.unlock();
      for (auto& d : done)
        if (d.st) d.st->complete_part();
      lk.lock();
      for (auto& d : done) pool_[d.dev].push_back(d.ev);
      pending_ -= done.size();
      if (pending_ == 0) drained_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_, drained_;
  std::map<rt::stream_t, std::deque<item>> queues_;
  std::map<int, std::vector<rt::event_t>> pool_;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::thread poller_;
#endif
};

}  // namespace kvstore::detail
