// The device work of a whole-value push and pull on a key's owner, issued on one of its streams:
// a push sums its inputs left to right in one fused pass that also stores the sum or applies the
// optimizer (inputs the owner cannot read are staged next to it in bounded chunks); a pull copies
// the value to each output (a broadcast). Called from the key's task (device/store_state.hpp's
// submit), its entry locked.
#pragma once

#include <kvstore/device/kernels.hpp>
#include <kvstore/device/key_state.hpp>
#include <kvstore/device/optimizer.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/store_state.hpp>
#include <kvstore/optim/all.hpp>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <span>
#include <vector>

namespace kvstore::detail {

/// Makes s wait, on the device, for the streams that produced the buffers.
template <class P>
void wait_producers(rt::stream_t s, std::span<const dev_ref<P>> bufs) {
  for (auto& r : bufs)
    if (r.stream && r.stream != s) rt::stream_wait_stream(r.dev, s, r.stream);
}

/// An optimizer that has no device kernel: gradient (in scratch), weight and state copied to the
/// host, updated there, copied back. Waits for the stream (this key's task only).
template <class T>
void host_update(device_entry<T>& e, const device_optimizer<T>& o, rt::stream_t s) {
  std::vector<T> g(e.size), w(e.size);
  optim::state<T> st;
  st.step = e.step;
  st.slots.resize(e.slots.size(), std::vector<T>(e.size));
  rt::copy_async(g.data(), e.scratch.data(), e.size * sizeof(T), s);
  rt::copy_async(w.data(), e.value.data(), e.size * sizeof(T), s);
  for (std::size_t i = 0; i < e.slots.size(); ++i)
    rt::copy_async(st.slots[i].data(), e.slots[i].data(), e.size * sizeof(T), s);
  rt::stream_sync(s);
  o.u.apply(e.k, std::span<const T>(g), std::span<T>(w), st, e.mult);
  e.step = st.step;
  rt::copy_async(e.value.data(), w.data(), e.size * sizeof(T), s);
  for (std::size_t i = 0; i < e.slots.size(); ++i)
    rt::copy_async(e.slots[i].data(), st.slots[i].data(), e.size * sizeof(T), s);
  rt::stream_sync(s);  // the host vectors go out of scope
}

/// Issues the sum of `in` into e (stored, or applied by `opt`), on stream s (index si) of c.
template <class T>
void issue_push(device_impl<T>& impl, device_entry<T>& e, device_ctx& c, int si, rt::stream_t s,
                std::span<const dev_ref<const T>> in, const device_optimizer<T>* opt) {
  wait_producers(s, in);
  ++e.pushes;
  reduce::device_update<T> u;
  T *s0 = nullptr, *s1 = nullptr;
  const bool on_device_update = prepare_update(e, opt, s, u, s0, s1);
  const int k = static_cast<int>(in.size());
  // Where the sum goes when it is not the update's own pass: scratch (host optimizer, or folding
  // more than max_fused_inputs into a gradient).
  const bool need_scratch = !on_device_update || (opt && k > reduce::max_fused_inputs);
  if (need_scratch && e.scratch.size() != e.size) e.scratch = device_buffer<T>(e.size, e.owner);
  T* target = on_device_update ? e.value.data() : e.scratch.data();
  T* partial = need_scratch ? e.scratch.data() : e.value.data();
  const reduce::device_update<T> sum_only{};
  const reduce::device_update<T>& upd = on_device_update ? u : sum_only;

  bool direct = true;
  for (auto& r : in) direct = direct && impl.readable(e.owner, r.dev);
  std::vector<const T*> p(in.size());
  if (direct) {
    for (std::size_t j = 0; j < in.size(); ++j) p[j] = in[j].ptr;
    reduce::fused_sum_update<T>(s, p.data(), k, target, s0, s1, partial, e.size, upd);
  } else {
    // Bounded staging: chunk by chunk, the inputs the owner cannot read are copied next to it,
    // then the same element-wise pass runs over that chunk.
    std::size_t staged = 0;
    for (auto& r : in) staged += impl.readable(e.owner, r.dev) ? 0 : 1;
    const std::size_t chunk = std::max<std::size_t>(impl.opts.staging_elems, 1);
    std::lock_guard sl(c.staging_m[si]);
    T* stage = static_cast<T*>(c.staging_for(si, staged * std::min(chunk, e.size) * sizeof(T)));
    for (std::size_t b = 0; b < e.size; b += chunk) {
      const std::size_t n = std::min(chunk, e.size - b);
      std::size_t slot = 0;
      for (std::size_t j = 0; j < in.size(); ++j) {
        if (impl.readable(e.owner, in[j].dev)) {
          p[j] = in[j].ptr + b;
        } else {
          T* dst = stage + slot++ * std::min(chunk, e.size);
          rt::copy_async(dst, in[j].ptr + b, n * sizeof(T), s);
          p[j] = dst;
        }
      }
      reduce::fused_sum_update<T>(s, p.data(), k, target + b, s0 ? s0 + b : nullptr,
                                  s1 ? s1 + b : nullptr, partial + b, n, upd);
    }
  }
  if (!on_device_update) host_update(e, *opt, s);
}

/// Broadcast from the owner: one copy per output. An output the owner's kernels can write (its
/// own memory, a peer's) is written by a copy kernel, which costs less to launch than a
/// device-to-device cudaMemcpyAsync; host memory gets a plain copy.
template <class T>
void issue_pull(device_impl<T>& impl, device_entry<T>& e, rt::stream_t s,
                std::span<const dev_ref<T>> outs) {
  for (auto& o : outs) {
    if (impl.readable(e.owner, o.dev)) {
      const T* src = e.value.data();
      reduce::fused_sum_update<T>(s, &src, 1, o.ptr, nullptr, nullptr, o.ptr, e.size,
                                  reduce::device_update<T>{});
    } else {
      rt::copy_async(o.ptr, e.value.data(), e.size * sizeof(T), s);
    }
  }
}

}  // namespace kvstore::detail
