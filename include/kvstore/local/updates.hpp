// What a key's task does to a local store's entry when it is pushed: the values summed and
// stored, or, with an optimizer, applied to the weight as a gradient (the whole key, some rows,
// or a range of elements), the key's state started fresh for another optimizer.
#pragma once

#include <kvstore/local/store_state.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/reduce/cpu.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace kvstore::detail {

// The state of `e` for optimizer `o`: a fresh one if it belonged to another optimizer.
template <class T>
optim::state<T>& local_state_for(local_entry<T>& e, const local_optimizer<T>& o) {
  if (e.state_gen != o.gen) {
    e.state = {};
    e.state_gen = o.gen;
  }
  return e.state;
}

// Runs in the key's task, e.m held.
template <class T>
void local_push_task(local_impl<T>& impl, local_entry<T>& e,
                     const std::vector<std::span<const T>>& srcs, const local_optimizer<T>* opt) {
  ++e.pushes;
  if (!opt) {
    impl.sum(e.value, srcs);
    return;
  }
  std::span<const T> grad = srcs.front();
  if (srcs.size() > 1) {
    e.scratch.resize(e.size);
    impl.sum(e.scratch, srcs);
    grad = e.scratch;
  }
  opt->u.apply(e.k, grad, e.value, local_state_for(e, *opt), e.mult);
}

// Runs in the key's task, e.m held. Rows are taken in ascending order; a row named several
// times is the sum of its values in the order given.
template <class T>
void local_push_rows_task(local_entry<T>& e, std::span<const std::int64_t> rows,
                          std::span<const T> values, const local_optimizer<T>* opt) {
  ++e.pushes;
  const std::size_t rl = e.row_length;
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (!std::is_sorted(rows.begin(), rows.end()))
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return rows[a] < rows[b]; });
  optim::state<T>* st = nullptr;
  if (opt) {
    st = &local_state_for(e, *opt);
    opt->u.ensure_state(*st, e.size);
    ++st->step;
  }
  std::vector<std::span<const T>> dup;
  for (std::size_t i = 0; i < order.size();) {
    const auto row = static_cast<std::size_t>(rows[order[i]]);
    std::size_t j = i + 1;
    while (j < order.size() && rows[order[j]] == rows[order[i]]) ++j;
    std::span<const T> grad = values.subspan(order[i] * rl, rl);
    if (j - i > 1) {
      dup.clear();
      for (std::size_t t = i; t < j; ++t) dup.push_back(values.subspan(order[t] * rl, rl));
      e.scratch.resize(rl);
      reduce::sum_into<T>(std::span<T>(e.scratch.data(), rl), dup);
      grad = std::span<const T>(e.scratch.data(), rl);
    }
    std::span<T> w(e.value.data() + row * rl, rl);
    if (opt)
      opt->u.fn(e.k, grad, w, optim::updater<T>::view(*st, row * rl, rl, e.mult));
    else
      std::copy(grad.begin(), grad.end(), w.begin());
    i = j;
  }
}

// Runs in the key's task, e.m held.
template <class T>
void local_push_range_task(local_entry<T>& e, std::size_t offset, std::span<const T> values,
                           const local_optimizer<T>* opt) {
  ++e.pushes;  // a push of some elements: one version
  std::span<T> w(e.value.data() + offset, values.size());
  if (!opt) {
    std::copy(values.begin(), values.end(), w.begin());
    return;
  }
  auto& st = local_state_for(e, *opt);
  opt->u.ensure_state(st, e.size);
  ++st.step;
  opt->u.fn(e.k, values, w, optim::updater<T>::view(st, offset, values.size(), e.mult));
}

}  // namespace kvstore::detail
