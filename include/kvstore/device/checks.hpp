// The checks of device memory a store makes at the call (the device is a known one, the memory is
// on the device its device_span states), and device failures named by the call, the key and the
// device. The wording is detail/checks.hpp's: "kvstore: <call> of key <k>: <problem>".
#pragma once

#include <kvstore/detail/checks.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/options.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::detail {

inline std::string device_list(const std::vector<int>& ds) {
  std::string s = "[";
  for (std::size_t i = 0; i < ds.size(); ++i) s += (i ? ", " : "") + std::to_string(ds[i]);
  return s + "]";
}

/// `s` may be read or written as memory of s.device for key k: the device is one of `devices`
/// (or, with none given, one that exists), the memory is not on another device, not host memory
/// on a CUDA build (cudaPointerGetAttributes there; the shim's allocation table on the OMP
/// build), and not null. Throws invalid_argument naming the key and the device.
template <class P>
void check_device_span(std::string_view call, const key& k, const device_span<P>& s,
                       const std::vector<int>* devices = nullptr) {
  const std::string dev = "device " + std::to_string(s.device);
  if (devices) {
    bool known = false;
    for (int d : *devices) known = known || d == s.device;
    if (!known)
      fail(errc::invalid_argument, call, k,
           dev + " is not one of the store's devices " + device_list(*devices));
  } else if (!rt::device_exists(s.device)) {
    fail(errc::invalid_argument, call, k,
         dev + " does not exist (" + std::to_string(rt::device_count()) + " visible)");
  }
  if (s.size && !s.ptr)
    fail(errc::invalid_argument, call, k,
         "null pointer on " + dev + " for " + std::to_string(s.size) + " elements");
  if (!s.size || !s.ptr) return;
  const int where = rt::pointer_device(s.ptr);
  if (where >= 0 && where != s.device)
    fail(errc::invalid_argument, call, k,
         "the memory given as on " + dev + " is on device " + std::to_string(where));
  if (where == rt::host_memory && rt::is_cuda)
    fail(errc::invalid_argument, call, k,
         "the memory given as on " + dev + " is host memory (pass a std::span for host memory)");
}

/// `s` holds `total` elements, the size of key k; the error names the device.
template <class P>
void check_device_size(std::string_view call, const key& k, std::uint64_t total,
                       const device_span<P>& s) {
  check_size(call, k, total, s.size, "on device " + std::to_string(s.device) + ", ");
}

/// Runs f; a kvstore::error from it (a CUDA failure, say) comes back naming the call, the key
/// and the device, with its code kept.
template <class F>
decltype(auto) on_device(std::string_view call, const key& k, int dev, F&& f) {
  try {
    return f();
  } catch (const error& x) {
    throw error(static_cast<errc>(x.code().value()), "kvstore: " + std::string(call) + " of key " +
                                                         k.str() + " on device " +
                                                         std::to_string(dev) + ": " + x.what());
  }
}

}  // namespace kvstore::detail
