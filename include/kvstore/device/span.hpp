// The vocabulary of device stores: the mode tag, device_span (memory on one device), the
// placement of keys on devices, the store's options. Free of CUDA and Thrust, so code that only
// names these (compat/data_parallel.hpp, dist.hpp's device_span calls) compiles without them.
#pragma once

#include <kvstore/fwd.hpp>

#include <cstddef>
#include <type_traits>
#include <vector>

struct CUstream_st;  // CUDA's stream type (cudaStream_t is CUstream_st*); opaque on the OMP build

namespace kvstore {

/// Mode tag: one process, several GPUs (or, with Thrust's OMP backend, virtual devices over host
/// memory).
struct device {};

/// A stream of a device: cudaStream_t on CUDA builds, an opaque handle on the OMP build.
using device_stream = CUstream_st*;

/// `size` elements of T at `ptr`, memory of device ordinal `device`. An aggregate, in this order;
/// `stream`, when set, is the stream that produced the data: the store's work on it waits for that
/// stream's work issued so far (without blocking the host). Left null, the data must be ready when
/// the call is made.
template <class T>
struct device_span {
  T* ptr = nullptr;
  std::size_t size = 0;
  int device = 0;
  device_stream stream = nullptr;

  using element_type = T;

  /// A read-only view of the same memory.
  template <class U = T>
  requires(!std::is_const_v<U>) operator device_span<const U>()
      const noexcept {  // NOLINT(google-explicit-constructor)
    return {ptr, size, device, stream};
  }
  T* data() const noexcept { return ptr; }
  bool empty() const noexcept { return size == 0; }
  /// Elements [offset, offset + count) on the same device and stream.
  device_span subspan(std::size_t offset, std::size_t count) const noexcept {
    return {ptr + offset, count, device, stream};
  }
};

/// Which device owns a key (holds its value, its optimizer state, and runs its updates):
/// `balanced` gives each new key to the device holding the fewest bytes so far (MXNet's merge
/// buffer placement), `first` gives every key to the first device of the store (Torch's
/// DataParallelTable: the primary GPU).
enum class placement { balanced, first };

/// Options of KVStore<device>.
struct device_options {
  /// The device ordinals the store uses (virtual ones on the OMP build); keys live on these and
  /// every device_span given to the store must be on one of them. Not empty, no repeats.
  std::vector<int> devices = {0};
  kvstore::placement placement = kvstore::placement::balanced;
  /// Threads of the engine that issues the work (the work itself runs on the devices' streams).
  unsigned threads = 2;
  /// Elements per staged chunk when a source cannot be read by the owner directly (host memory,
  /// or a GPU without peer access): bounded staging memory per device.
  std::size_t staging_elems = std::size_t{1} << 20;
};

namespace detail {
/// KVStore<dist>'s calls with device_span values (MXNet's dist_device_sync) hand their device
/// work to dist_device_bridge<T>, which <kvstore/device.hpp> defines (device/dist_bridge.hpp):
/// dist.hpp names it only here, so it needs no Thrust or CUDA.
template <class T>
class dist_device_bridge;
}  // namespace detail

/// True for device_span<T> of any T.
template <class S>
inline constexpr bool is_device_span_v = false;
template <class T>
inline constexpr bool is_device_span_v<device_span<T>> = true;

}  // namespace kvstore
