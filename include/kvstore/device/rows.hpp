// The device work of push_rows and pull_rows on a matrix key's owner: rows taken in ascending
// order, a row named several times summed in the order given (as KVStore<local> does), stored or
// applied by the optimizer in one pass; rows gathered in the order named. Called from the key's
// task (device/store_state.hpp's submit), its entry locked.
#pragma once

#include <kvstore/device/kernels.hpp>
#include <kvstore/device/key_state.hpp>
#include <kvstore/device/optimizer.hpp>
#include <kvstore/device/push_pull.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/store_state.hpp>
#include <kvstore/optim/all.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace kvstore::detail {

/// The rows' update with an optimizer that has no device kernel: on host copies of the weight,
/// the values and the state, then copied back. Waits for the stream (this key's task only).
template <class T>
void host_rows_update(device_entry<T>& e, const device_optimizer<T>& o, rt::stream_t s,
                      const std::vector<std::int64_t>& urow, const std::vector<std::uint64_t>& off,
                      const std::vector<std::uint64_t>& order, dev_ref<const T> values) {
  const std::size_t rl = e.row_length;
  ensure_state(e, o, s);
  std::vector<T> w(e.size), v(values.size);
  std::vector<std::vector<T>> sl(e.slots.size(), std::vector<T>(e.size));
  rt::copy_async(w.data(), e.value.data(), e.size * sizeof(T), s);
  rt::copy_async(v.data(), values.ptr, values.size * sizeof(T), s);
  for (std::size_t i = 0; i < sl.size(); ++i)
    rt::copy_async(sl[i].data(), e.slots[i].data(), e.size * sizeof(T), s);
  rt::stream_sync(s);
  optim::state<T> st;
  st.step = ++e.step;
  st.slots = std::move(sl);
  std::vector<T> g(rl);
  for (std::size_t u = 0; u < urow.size(); ++u) {
    for (std::size_t c = 0; c < rl; ++c) {
      T x = v[order[off[u]] * rl + c];
      for (std::uint64_t j = off[u] + 1; j < off[u + 1]; ++j) x = x + v[order[j] * rl + c];
      g[c] = x;
    }
    const std::size_t at = static_cast<std::size_t>(urow[u]) * rl;
    o.u.fn(e.k, std::span<const T>(g), std::span<T>(w).subspan(at, rl),
           optim::updater<T>::view(st, at, rl, e.mult));
  }
  rt::copy_async(e.value.data(), w.data(), e.size * sizeof(T), s);
  for (std::size_t i = 0; i < st.slots.size(); ++i)
    rt::copy_async(e.slots[i].data(), st.slots[i].data(), e.size * sizeof(T), s);
  rt::stream_sync(s);
}

/// Issues push_rows of `values` (rows.size() * row_length elements) into e on stream s.
template <class T>
void issue_push_rows(device_impl<T>& impl, device_entry<T>& e, rt::stream_t s,
                     std::span<const std::int64_t> rows, dev_ref<const T> values,
                     const device_optimizer<T>* opt) {
  wait_producers(s, std::span<const dev_ref<const T>>(&values, 1));
  ++e.pushes;
  if (rows.empty()) {
    if (opt) {  // the step still advances, as local's
      ensure_state(e, *opt, s);
      ++e.step;
    }
    return;
  }
  const std::size_t rl = e.row_length;
  std::vector<std::uint64_t> order(rows.size());
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint64_t a, std::uint64_t b) { return rows[a] < rows[b]; });
  std::vector<std::int64_t> urow;
  std::vector<std::uint64_t> off;
  for (std::size_t i = 0; i < order.size(); ++i)
    if (i == 0 || rows[order[i]] != rows[order[i - 1]]) {
      urow.push_back(rows[order[i]]);
      off.push_back(i);
    }
  off.push_back(order.size());

  if (opt && !opt->fused) {
    host_rows_update(e, *opt, s, urow, off, order, values);
    return;
  }
  reduce::device_update<T> u;
  T *s0 = nullptr, *s1 = nullptr;
  prepare_update(e, opt, s, u, s0, s1);
  // The index arrays (and values the owner cannot read) go to stream-ordered temporaries.
  const std::size_t ib = urow.size() * 8, ob = off.size() * 8, xb = order.size() * 8;
  auto* tmp = static_cast<char*>(rt::dev_malloc_async(ib + ob + xb, s));
  rt::copy_async(tmp, urow.data(), ib, s);
  rt::copy_async(tmp + ib, off.data(), ob, s);
  rt::copy_async(tmp + ib + ob, order.data(), xb, s);
  const T* vals = values.ptr;
  T* vtmp = nullptr;
  if (!impl.readable(e.owner, values.dev)) {
    vtmp = static_cast<T*>(rt::dev_malloc_async(values.size * sizeof(T), s));
    rt::copy_async(vtmp, values.ptr, values.size * sizeof(T), s);
    vals = vtmp;
  }
  reduce::rows_update<T>(s, vals, reinterpret_cast<const std::int64_t*>(tmp),
                         reinterpret_cast<const std::uint64_t*>(tmp + ib),
                         reinterpret_cast<const std::uint64_t*>(tmp + ib + ob), urow.size(), rl,
                         e.value.data(), s0, s1, u);
  rt::dev_free_async(vtmp, s);
  rt::dev_free_async(tmp, s);
  // The host index vectors die here: a pageable-memory copy has taken them by the time
  // cudaMemcpyAsync returns, so this is safe.
}

/// Issues pull_rows of `rows` from e into `out` (rows.size() * row_length elements) on stream s.
template <class T>
void issue_pull_rows(device_impl<T>& impl, device_entry<T>& e, rt::stream_t s,
                     std::span<const std::int64_t> rows, dev_ref<T> out) {
  if (rows.empty()) return;
  const std::size_t ib = rows.size() * sizeof(std::int64_t);
  auto* idx = static_cast<std::int64_t*>(rt::dev_malloc_async(ib, s));
  rt::copy_async(idx, rows.data(), ib, s);
  const bool direct = impl.readable(e.owner, out.dev);
  T* dst = direct ? out.ptr : static_cast<T*>(rt::dev_malloc_async(out.size * sizeof(T), s));
  reduce::gather_rows<T>(s, e.value.data(), idx, rows.size(), e.row_length, dst);
  if (!direct) {
    rt::copy_async(out.ptr, dst, out.size * sizeof(T), s);
    rt::dev_free_async(dst, s);
  }
  rt::dev_free_async(idx, s);
}

}  // namespace kvstore::detail
