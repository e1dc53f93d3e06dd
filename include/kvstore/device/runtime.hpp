// The few CUDA runtime calls the device store makes, behind one small shim. On a CUDA build
// (nvcc, Thrust's CUDA backend) they are the runtime's; on the OMP build (g++, Thrust's OMP
// backend) devices are virtual ordinals over host memory and every call is a plain host one:
// copies are memcpy, and streams are ordered because all work on them runs at once. Every failure
// is a kvstore::error(errc::device_error) naming the call; the store adds the key and device.
#pragma once

#include <kvstore/device/span.hpp>
#include <kvstore/error.hpp>

#include <thrust/detail/config.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <cuda_runtime.h>
#define KVSTORE_DEVICE_CUDA 1
#else
#define KVSTORE_DEVICE_CUDA 0
#endif

namespace kvstore::detail::rt {

struct event_st;  // on CUDA builds, a cudaEvent_t cast; opaque
using stream_t = device_stream;
using event_t = event_st*;

/// True on CUDA builds: memory and ordinals are real.
inline constexpr bool is_cuda = KVSTORE_DEVICE_CUDA != 0;

/// What pointer_device says about memory it cannot place on one device.
inline constexpr int host_memory = -1;     ///< plain (or pinned) host memory
inline constexpr int managed_memory = -2;  ///< CUDA managed memory: readable on any device

[[noreturn]] inline void fail(const std::string& what) { throw error(errc::device_error, what); }

#if KVSTORE_DEVICE_CUDA

inline void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    fail(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
         ")");
  }
}

inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
inline bool device_exists(int d) { return d >= 0 && d < device_count(); }

/// Makes `d` current for the scope (the runtime's current device is per thread).
class device_guard {
 public:
  explicit device_guard(int d) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != d) check(cudaSetDevice(d), "cudaSetDevice");
  }
  ~device_guard() { (void)cudaSetDevice(prev_); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int prev_ = 0;
};

inline void* dev_malloc(int d, std::size_t bytes) {
  device_guard g(d);
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}
inline void dev_free(int d, void* p) noexcept {
  if (!p) return;
  int prev = 0;
  (void)cudaGetDevice(&prev);
  (void)cudaSetDevice(d);
  (void)cudaFree(p);
  (void)cudaSetDevice(prev);
}
/// Stream-ordered temporaries (freed once the stream's earlier work is done).
inline void* dev_malloc_async(std::size_t bytes, stream_t s) {
  void* p = nullptr;
  check(cudaMallocAsync(&p, bytes ? bytes : 1, s), "cudaMallocAsync");
  return p;
}
inline void dev_free_async(void* p, stream_t s) {
  if (p) check(cudaFreeAsync(p, s), "cudaFreeAsync");
}
inline void* pinned_malloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable), "cudaHostAlloc");
  return p;
}
inline void pinned_free(void* p) noexcept {
  if (p) (void)cudaFreeHost(p);
}

/// (greatest, least) stream priority of the device: numerically, greatest < least.
inline std::pair<int, int> priority_range(int d) {
  device_guard g(d);
  int least = 0, greatest = 0;
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  return {greatest, least};
}
inline stream_t stream_create(int d, int cuda_priority) {
  device_guard g(d);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, cuda_priority),
        "cudaStreamCreateWithPriority");
  return s;
}
inline void stream_destroy(int d, stream_t s) noexcept {
  if (!s) return;
  int prev = 0;
  (void)cudaGetDevice(&prev);
  (void)cudaSetDevice(d);
  (void)cudaStreamDestroy(s);
  (void)cudaSetDevice(prev);
}
inline void stream_sync(stream_t s) { check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }

inline event_t event_create(int d) {
  device_guard g(d);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return reinterpret_cast<event_t>(e);
}
inline void event_destroy(event_t e) noexcept {
  if (e) (void)cudaEventDestroy(reinterpret_cast<cudaEvent_t>(e));
}
inline void event_record(event_t e, stream_t s) {
  check(cudaEventRecord(reinterpret_cast<cudaEvent_t>(e), s), "cudaEventRecord");
}
inline void event_sync(event_t e) {
  check(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
}
/// `s` waits (on the device, not the host) for the work recorded in `e`.
inline void stream_wait_event(stream_t s, event_t e) {
  check(cudaStreamWaitEvent(s, reinterpret_cast<cudaEvent_t>(e), 0), "cudaStreamWaitEvent");
}
/// `s` waits for everything issued on `producer` so far (a temporary event, no host wait).
inline void stream_wait_stream(int producer_device, stream_t s, stream_t producer) {
  event_t e = event_create(producer_device);
  event_record(e, producer);
  stream_wait_event(s, e);
  event_destroy(e);  // released once the wait has been satisfied; legal while pending
}

/// A copy between any two memories (host, any device: unified addressing), ordered on `s`.
inline void copy_async(void* dst, const void* src, std::size_t bytes, stream_t s) {
  if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
}
inline void memset_async(void* dst, std::size_t bytes, stream_t s) {
  if (bytes) check(cudaMemsetAsync(dst, 0, bytes, s), "cudaMemsetAsync");
}
/// Throws the error of the last launch (kernel configuration errors show here).
inline void check_launch(const char* what) { check(cudaGetLastError(), what); }

inline bool can_access_peer(int d, int peer) {
  if (d == peer) return true;
  int ok = 0;
  check(cudaDeviceCanAccessPeer(&ok, d, peer), "cudaDeviceCanAccessPeer");
  return ok != 0;
}
/// Lets kernels on `d` read memory of `peer`. Already enabled counts as success.
inline void enable_peer_access(int d, int peer) {
  device_guard g(d);
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return;
  }
  check(e, "cudaDeviceEnablePeerAccess");
}

/// The device ordinal `p` is memory of, or host_memory / managed_memory.
inline int pointer_device(const void* p) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return host_memory;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice:
      return a.device;
    case cudaMemoryTypeManaged:
      return managed_memory;
    default:
      return host_memory;
  }
}

#else  // ---- OMP build: virtual devices over host memory -----------------------------------

inline void check_launch(const char*) {}
inline int device_count() { return 1 << 16; }
/// Any non-negative ordinal names a virtual device.
inline bool device_exists(int d) { return d >= 0; }

class device_guard {
 public:
  explicit device_guard(int) {}
};

/// Allocations made through the shim, by device, so that a device_span stating another device
/// than its memory's is caught as on a CUDA build (cudaPointerGetAttributes).
struct allocation_table {
  std::mutex m;
  std::map<std::uintptr_t, std::pair<std::uintptr_t, int>> by_start;  // start -> (end, device)
};
inline allocation_table& allocations() {
  static allocation_table t;
  return t;
}

// Aligned like cudaMalloc (256 bytes), so vector loads behave as on a GPU.
inline void* dev_malloc(int d, std::size_t bytes) {
  void* p = ::operator new (bytes ? bytes : 1, std::align_val_t{256});
  auto& t = allocations();
  std::lock_guard lk(t.m);
  const auto b = reinterpret_cast<std::uintptr_t>(p);
  t.by_start[b] = {b + (bytes ? bytes : 1), d};
  return p;
}
inline void dev_free(int, void* p) noexcept {
  if (!p) return;
  {
    auto& t = allocations();
    std::lock_guard lk(t.m);
    t.by_start.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  ::operator delete (p, std::align_val_t{256});
}
inline void* dev_malloc_async(std::size_t bytes, stream_t) {
  return ::operator new (bytes ? bytes : 1, std::align_val_t{256});
}
inline void dev_free_async(void* p, stream_t) {
  if (p) ::operator delete (p, std::align_val_t{256});
}
inline void* pinned_malloc(std::size_t bytes) {
  return ::operator new (bytes ? bytes : 1, std::align_val_t{256});
}
inline void pinned_free(void* p) noexcept {
  if (p) ::operator delete (p, std::align_val_t{256});
}

inline std::pair<int, int> priority_range(int) { return {0, 0}; }
// A distinct non-null handle per stream (never dereferenced).
inline stream_t stream_create(int, int) { return reinterpret_cast<stream_t>(new char(0)); }
inline void stream_destroy(int, stream_t s) noexcept { delete reinterpret_cast<char*>(s); }
inline void stream_sync(stream_t) {}
inline event_t event_create(int) { return reinterpret_cast<event_t>(new char(0)); }
inline void event_destroy(event_t e) noexcept { delete reinterpret_cast<char*>(e); }
inline void event_record(event_t, stream_t) {}
inline void event_sync(event_t) {}
inline void stream_wait_event(stream_t, event_t) {}
inline void stream_wait_stream(int, stream_t, stream_t) {}
inline void copy_async(void* dst, const void* src, std::size_t bytes, stream_t) {
  if (bytes) std::memmove(dst, src, bytes);
}
inline void memset_async(void* dst, std::size_t bytes, stream_t) {
  if (bytes) std::memset(dst, 0, bytes);
}
inline bool can_access_peer(int, int) { return true; }
inline void enable_peer_access(int, int) {}

inline int pointer_device(const void* p) {
  auto& t = allocations();
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lk(t.m);
  auto it = t.by_start.upper_bound(a);
  if (it == t.by_start.begin()) return host_memory;
  --it;
  return a < it->second.first ? it->second.second : host_memory;
}

#endif

}  // namespace kvstore::detail::rt
