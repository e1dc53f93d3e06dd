// device_buffer<T>: an owning array in one device's memory (cudaMalloc on CUDA builds; host
// memory tagged with its virtual device on the OMP build), for tests, examples and the stores'
// own storage.
#pragma once

#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace kvstore {

/// `size()` elements of T on device `device()`. Move-only. Contents start undefined. The copying
/// members block until the copy is done and throw kvstore::error(device_error) on failure.
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  /// n elements on device d (uninitialized).
  device_buffer(std::size_t n, int d) : size_(n), device_(d) {
    if (n) ptr_ = static_cast<T*>(detail::rt::dev_malloc(d, n * sizeof(T)));
  }
  /// A copy of `host` on device d.
  device_buffer(std::span<const T> host, int d) : device_buffer(host.size(), d) { copy_from(host); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        device_(o.device_) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  ~device_buffer() { reset(); }

  T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  bool empty() const noexcept { return size_ == 0; }

  /// The whole buffer as a device_span (no stream).
  device_span<T> span() const noexcept { return {ptr_, size_, device_}; }
  device_span<const T> cspan() const noexcept { return {ptr_, size_, device_}; }
  operator device_span<T>() const noexcept { return span(); }         // NOLINT
  operator device_span<const T>() const noexcept { return cspan(); }  // NOLINT

  /// Copies host.size() (<= size()) elements in, blocking.
  void copy_from(std::span<const T> host) {
    detail::rt::device_guard g(device_);
    copy_sync(ptr_, host.data(), host.size() * sizeof(T));
  }
  /// Sets every element to zero, blocking.
  void zero() {
    detail::rt::device_guard g(device_);
    detail::rt::memset_async(ptr_, size_ * sizeof(T), nullptr);
    sync();
  }
  /// The contents, copied to the host (blocking).
  std::vector<T> to_host() const {
    std::vector<T> out(size_);
    detail::rt::device_guard g(device_);
    copy_sync(out.data(), ptr_, size_ * sizeof(T));
    return out;
  }

  /// Frees the memory; the buffer is then empty.
  void reset() noexcept {
    if (ptr_) detail::rt::dev_free(device_, ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }

 private:
  // The legacy default stream (null): ordered after work on blocking streams, then waited for.
  static void copy_sync(void* dst, const void* src, std::size_t bytes) {
    detail::rt::copy_async(dst, src, bytes, nullptr);
    sync();
  }
  static void sync() { detail::rt::stream_sync(nullptr); }

  T* ptr_ = nullptr;
  std::size_t size_ = 0;
  int device_ = 0;
};

}  // namespace kvstore
