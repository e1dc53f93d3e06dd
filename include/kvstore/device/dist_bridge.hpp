// The device side of KVStore<dist>'s device_span calls (MXNet's dist_device_sync). dist.hpp
// declares dist_device_bridge<T> (device/span.hpp) and calls it from those calls; this file,
// included by device.hpp only, defines it, so dist.hpp and kvstore.hpp never need Thrust or CUDA.
//
// A push of several devices' values is summed on the first one's device and copied into the
// key's pinned host buffer, which is then pushed once; a pull lands in that buffer and is copied
// to each device. The work is issued on the bridge's streams (one normal and one high priority
// per device) with the pieces of device/staging.hpp, and no host thread waits for it: the
// completion queue (device/completion.hpp) runs the caller's continuation once the bytes are
// where they were sent.
#pragma once

#include <kvstore/device/checks.hpp>
#include <kvstore/device/completion.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/device/staging.hpp>
#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/op.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// One per KVStore<dist, T> that was given a device_span, made on the first such call. Calls
/// for different keys may come from several threads at once; the calls for one key come one at
/// a time (the engine's per-key order), so a key's pinned buffer is used by one op at a time.
template <class T>
class dist_device_bridge {
 public:
  /// Runs once the issued work is done: nullptr, or the error (naming the call, the key and the
  /// device). Must not throw.
  using then_fn = std::function<void(std::exception_ptr)>;

  dist_device_bridge() = default;
  dist_device_bridge(const dist_device_bridge&) = delete;
  dist_device_bridge& operator=(const dist_device_bridge&) = delete;
  /// Waits for the work handed to the completion queue, then frees the streams (the pinned
  /// buffers go with the members).
  ~dist_device_bridge() {
    done_q_.drain();
    for (auto& [d, ss] : streams_)
      for (auto s : ss) {
        try {
          rt::device_guard g(d);
          rt::stream_sync(s);
        } catch (...) {
        }
        rt::stream_destroy(d, s);
      }
  }

  /// The checks of one device value of key k (`total` elements) at the call: the device exists,
  /// the memory is on it (device/checks.hpp), and the size is the key's. Throws
  /// invalid_argument or size_mismatch naming the key and the device.
  template <class P>
  static void check(std::string_view call, const key& k, std::uint64_t total,
                    const device_span<P>& s) {
    check_device_span(call, k, s);
    check_device_size(call, k, total, s);
  }

  /// Key `id`'s pinned host buffer of n elements: made on the key's first device call and kept
  /// with the store (MXNet keeps one per key too), so a push or pull allocates nothing.
  std::span<T> pinned(std::uint64_t id, std::size_t n) {
    std::lock_guard lk(m_);
    auto& b = pinned_[id];
    if (b.size() != n) b = pinned_buffer<T>(n);
    return b.span();
  }

  /// Issues the sum of `srcs` (all of host.size() elements, summed left to right on srcs[0]'s
  /// device) into `host`; then(nullptr) once host holds it.
  void gather(std::string_view call, const key& k, std::span<const device_span<const T>> srcs,
              std::span<T> host, int priority, then_fn then) {
    const int d = srcs[0].device;
    std::vector<std::pair<int, rt::stream_t>> used;
    std::exception_ptr err;
    try {
      on_device(call, k, d, [&] {
        rt::device_guard g(d);
        const rt::stream_t s = stream(d, priority);
        used.emplace_back(d, s);
        scratch tmp(gather_scratch_elems(srcs), s);
        issue_gather(s, srcs, host.data(), tmp.p);
      });
    } catch (...) {
      err = std::current_exception();
    }
    finish(call, k, used, err, std::move(then));
  }

  /// Issues a copy of `host` into each of `dsts` (on its own device); then(nullptr) once every
  /// copy is done.
  void scatter(std::string_view call, const key& k, std::span<const T> host,
               std::span<const device_span<T>> dsts, int priority, then_fn then) {
    std::vector<std::pair<int, rt::stream_t>> used;
    std::exception_ptr err;
    try {
      for (auto& x : dsts)
        on_device(call, k, x.device, [&] {
          rt::device_guard g(x.device);
          const rt::stream_t s = stream(x.device, priority);
          issue_scatter_one(s, host.data(), x);
          bool seen = false;
          for (auto& u : used) seen = seen || u.first == x.device;
          if (!seen) used.emplace_back(x.device, s);
        });
    } catch (...) {
      err = std::current_exception();
    }
    finish(call, k, used, err, std::move(then));
  }

  /// A copy of a device value on the host, blocking (for init, which blocks anyway).
  std::vector<T> to_host(std::string_view call, const key& k, const device_span<const T>& s) {
    std::vector<T> out(s.size);
    on_device(call, k, s.device, [&] {
      rt::device_guard g(s.device);
      const rt::stream_t st = stream(s.device, 0);
      if (s.stream && s.stream != st) rt::stream_wait_stream(s.device, st, s.stream);
      rt::copy_async(out.data(), s.ptr, s.size * sizeof(T), st);
      rt::stream_sync(st);
    });
    return out;
  }

 private:
  // Stream-ordered device scratch, freed on the stream once the work issued before is done
  // (also when issuing failed half way).
  struct scratch {
    scratch(std::size_t n, rt::stream_t s)
        : p(n ? static_cast<T*>(rt::dev_malloc_async(n * sizeof(T), s)) : nullptr), st(s) {}
    ~scratch() {
      try {
        rt::dev_free_async(p, st);
      } catch (...) {
      }
    }
    scratch(const scratch&) = delete;
    scratch& operator=(const scratch&) = delete;
    T* p;
    rt::stream_t st;
  };

  // Device d's stream for an op of this priority (normal, or high for priority > 0).
  rt::stream_t stream(int d, int priority) {
    std::lock_guard lk(m_);
    auto it = streams_.find(d);
    if (it == streams_.end()) {
      const auto [greatest, least] = rt::priority_range(d);
      std::array<rt::stream_t, 2> ss{rt::stream_create(d, least), nullptr};
      try {
        ss[1] = rt::stream_create(d, greatest);
      } catch (...) {
        rt::stream_destroy(d, ss[0]);
        throw;
      }
      it = streams_.emplace(d, ss).first;
    }
    return it->second[priority > 0 ? 1 : 0];
  }

  // then runs once the work issued on the `used` streams has passed, with `err` (an error while
  // issuing) or the first error of the completion; work already issued is waited for even when
  // issuing failed half way, so the caller's buffers are free once then runs.
  void finish(std::string_view call, const key& k,
              const std::vector<std::pair<int, rt::stream_t>>& used, std::exception_ptr err,
              then_fn then) {
    const std::size_t parts = used.size() + (err ? 1 : 0);
    if (parts == 0) return then(nullptr);
    auto st = std::make_shared<op_state>(parts, std::move(then));
    for (auto& [d, s] : used) {
      try {
        on_device(call, k, d, [&, d = d, s = s] {
          rt::device_guard g(d);
          done_q_.add(d, s, st);
        });
      } catch (...) {
        st->complete_part(std::current_exception());
      }
    }
    if (err) st->complete_part(err);
  }

  std::mutex m_;  ///< guards streams_ and pinned_ (the maps)
  std::map<int, std::array<rt::stream_t, 2>> streams_;
  std::unordered_map<std::uint64_t, pinned_buffer<T>> pinned_;
  completion_queue done_q_;  ///< last: drained (in the destructor) before the rest goes
};

}  // namespace kvstore::detail
