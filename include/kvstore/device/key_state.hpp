// What a device store keeps per key (its value and optimizer state on the owner device, where
// its last op left off), and one buffer of a call as the store's tasks see it.
#pragma once

#include <kvstore/device/buffer.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/key.hpp>
#include <kvstore/op.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// One input or output buffer of a call: host memory (dev < 0) or memory of device `dev`, with
/// the stream that produced it (null: ready at the call).
template <class P>
struct dev_ref {
  P* ptr;
  std::size_t size;
  int dev;
  device_stream stream;
};

/// A device_span as a buffer of a call (checked by the caller: device/checks.hpp).
template <class P>
dev_ref<P> to_ref(device_span<P> s) noexcept {
  return {s.ptr, s.size, s.device, s.stream};
}
/// Host memory as a buffer of a call.
template <class P>
dev_ref<P> to_ref(std::span<P> s) noexcept {
  return {s.data(), s.size(), -1, nullptr};
}

/// One key of a device store. `k`, `size`, `row_length` and `owner` never change after init; the
/// rest is touched only by the key's own tasks (one at a time, per the engine) and, under `m`, by
/// saving and loading optimizer states and by waits.
template <class T>
struct device_entry {
  device_entry(key k_, std::size_t n, std::size_t rl, int owner_)
      : k(std::move(k_)), size(n), row_length(rl), owner(owner_), value(n, owner_) {}
  ~device_entry() { rt::event_destroy(done); }
  device_entry(const device_entry&) = delete;
  device_entry& operator=(const device_entry&) = delete;

  const key k;
  const std::size_t size;
  const std::size_t row_length;
  const int owner;
  std::mutex m;
  device_buffer<T> value;
  /// Optimizer state on the owner: step count and num_slots arrays (empty until first update).
  std::uint64_t step = 0;
  std::vector<device_buffer<T>> slots;
  std::uint64_t state_gen = 0;  ///< the optimizer generation the state belongs to
  device_buffer<T> scratch;     ///< partial sums of more than max_fused_inputs values
  /// The stream of the key's last op, and an event recorded there when another stream (the next
  /// op's, stream_wait's consumer) must wait for it on the device.
  rt::stream_t last_stream = nullptr;
  rt::event_t done = nullptr;
  std::shared_ptr<op_state> last_op;  ///< the op of the last part issued (wait(key) waits for it)
};

}  // namespace kvstore::detail
