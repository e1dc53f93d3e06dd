// The device side of MXNet's dist_device_sync: several devices' values summed on one device and
// staged into pinned host memory (one network push), and a pinned host buffer (one pull)
// broadcast to several devices. The pieces issue work on a stream without waiting
// (device/dist_bridge.hpp uses them so); device_staging runs them and blocks. Pinned memory is
// cudaHostAlloc'd on CUDA builds (so copies run at full PCIe/NVLink-C2C speed and
// asynchronously), plain host memory on the OMP build.
#pragma once

#include <kvstore/device/buffer.hpp>
#include <kvstore/device/kernels.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/error.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvstore {

/// Page-locked host memory of `size()` elements. Move-only.
template <class T>
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t n) : size_(n) {
    if (n) ptr_ = static_cast<T*>(detail::rt::pinned_malloc(n * sizeof(T)));
  }
  pinned_buffer(pinned_buffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { detail::rt::pinned_free(ptr_); }

  T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return size_; }
  std::span<T> span() const noexcept { return {ptr_, size_}; }

 private:
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

namespace detail {

/// Whether kernels on device d can read memory of device src (peer access is enabled on the
/// first ask; always on the OMP build's virtual devices).
inline bool peer_readable(int d, int src) {
  if (!rt::is_cuda || src == d) return true;
  return rt::can_access_peer(d, src) && (rt::enable_peer_access(d, src), true);
}

/// The device scratch, in elements on srcs[0]'s device, that issue_gather needs for these
/// sources: none for one source, else the sum, a partial sum (more than max_fused_inputs) and a
/// copy of each source the device cannot read.
template <class T>
std::size_t gather_scratch_elems(std::span<const device_span<const T>> srcs) {
  if (srcs.size() < 2) return 0;
  const int d = srcs[0].device;
  std::size_t remote = 0;
  for (auto& x : srcs) remote += peer_readable(d, x.device) ? 0 : 1;
  return srcs[0].size * (2 + remote);
}

/// Issues on stream s of srcs[0]'s device (current): s waits for the sources' streams, then the
/// sum of srcs (left to right, as reduce/cpu.hpp; one fused pass up to max_fused_inputs) is
/// copied into `host`. One source is copied as it is. `scratch` holds gather_scratch_elems.
/// Sizes are the caller's to check.
template <class T>
void issue_gather(rt::stream_t s, std::span<const device_span<const T>> srcs, T* host, T* scratch) {
  const int d = srcs[0].device;
  const std::size_t n = srcs[0].size;
  for (auto& x : srcs)
    if (x.stream && x.stream != s) rt::stream_wait_stream(x.device, s, x.stream);
  if (srcs.size() == 1) {
    rt::copy_async(host, srcs[0].ptr, n * sizeof(T), s);
    return;
  }
  std::vector<const T*> p;
  std::size_t slot = 2;
  for (auto& x : srcs) {
    if (peer_readable(d, x.device)) {
      p.push_back(x.ptr);
    } else {
      T* dst = scratch + n * slot++;
      rt::copy_async(dst, x.ptr, n * sizeof(T), s);
      p.push_back(dst);
    }
  }
  reduce::fused_sum_update<T>(s, p.data(), static_cast<int>(p.size()), scratch, nullptr, nullptr,
                              scratch + n, n, reduce::device_update<T>{});
  rt::copy_async(host, scratch, n * sizeof(T), s);
}

/// Issues a copy of `host` into dst on stream s of dst's device (current), after the work of
/// dst's own stream (earlier readers of the old values).
template <class T>
void issue_scatter_one(rt::stream_t s, const T* host, const device_span<T>& dst) {
  if (dst.stream && dst.stream != s) rt::stream_wait_stream(dst.device, s, dst.stream);
  rt::copy_async(dst.ptr, host, dst.size * sizeof(T), s);
}

}  // namespace detail

/// Staging between several devices and the host for one key at a time: gather() sums device
/// values into pinned host memory, scatter() copies host values to several devices. Each call
/// blocks until its copies are done (the network send needs the bytes, and the devices' values
/// are then ready). Not thread-safe: one stager per worker thread or key. (KVStore<dist> issues
/// the same pieces without blocking: device/dist_bridge.hpp.)
/// Errors: kvstore::error(invalid_argument) for mismatched sizes or no inputs,
/// kvstore::error(device_error) naming the device for a device failure.
template <class T>
class device_staging {
 public:
  device_staging() = default;
  device_staging(const device_staging&) = delete;
  device_staging& operator=(const device_staging&) = delete;
  ~device_staging() {
    for (auto& [d, s] : streams_) detail::rt::stream_destroy(d, s);
  }

  /// The sum of `srcs` (summed left to right on the device of srcs[0], in one pass when at most
  /// reduce::max_fused_inputs; inputs on devices without peer access are copied there first),
  /// copied into pinned host memory. The span stays valid until the next call.
  std::span<const T> gather(std::span<const device_span<const T>> srcs) {
    if (srcs.empty())
      throw error(errc::invalid_argument, "kvstore: device_staging::gather of no values");
    const std::size_t n = srcs[0].size;
    for (auto& s : srcs)
      if (s.size != n)
        throw error(errc::invalid_argument, "kvstore: device_staging::gather: values of " +
                                                std::to_string(n) + " and " +
                                                std::to_string(s.size) + " elements");
    const int d = srcs[0].device;
    return on(d, [&] {
      auto s = stream(d);
      detail::rt::device_guard g(d);
      if (host_.size() < n) host_ = pinned_buffer<T>(n);
      const std::size_t need = detail::gather_scratch_elems(srcs);
      if (scratch_.size() < need || scratch_.device() != d) scratch_ = device_buffer<T>(need, d);
      detail::issue_gather(s, srcs, host_.data(), scratch_.data());
      detail::rt::stream_sync(s);
      return std::span<const T>(host_.data(), n);
    });
  }

  /// Copies `host` (ideally pinned: see pinned()) into every one of `dsts`, blocking.
  void scatter(std::span<const T> host, std::span<const device_span<T>> dsts) {
    for (auto& x : dsts)
      if (x.size != host.size())
        throw error(errc::invalid_argument, "kvstore: device_staging::scatter of " +
                                                std::to_string(host.size()) + " elements into " +
                                                std::to_string(x.size));
    for (auto& x : dsts)
      on(x.device, [&] {
        detail::rt::device_guard g(x.device);
        detail::issue_scatter_one(stream(x.device), host.data(), x);
        return 0;
      });
    for (auto& [d, s] : streams_)
      on(d, [&] {
        detail::rt::device_guard g(d);
        detail::rt::stream_sync(s);
        return 0;
      });
  }

  /// Pinned host memory of at least n elements (for a pull to land in), valid until the next call.
  std::span<T> pinned(std::size_t n) {
    if (host_.size() < n) host_ = pinned_buffer<T>(n);
    return {host_.data(), n};
  }

 private:
  template <class F>
  static auto on(int d, F&& f) {
    try {
      return f();
    } catch (const error& x) {
      throw error(static_cast<errc>(x.code().value()),
                  "kvstore: staging on device " + std::to_string(d) + ": " + x.what());
    }
  }
  detail::rt::stream_t stream(int d) {
    for (auto& [dev, s] : streams_)
      if (dev == d) return s;
    streams_.emplace_back(d, detail::rt::stream_create(d, 0));
    return streams_.back().second;
  }

  std::vector<std::pair<int, detail::rt::stream_t>> streams_;
  pinned_buffer<T> host_;
  device_buffer<T> scratch_;
};

}  // namespace kvstore
