// The shared state of one local store: its keys (each key's value, optimizer state, multipliers
// and version), the optimizer with its generation, and the engine; the lookups and inserts of
// keys that every call of KVStore<local> (local.hpp) goes through, with their checks.
#pragma once

#include <kvstore/detail/checks.hpp>
#include <kvstore/engine/engine.hpp>
#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>
#include <kvstore/reduce/cpu.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// One key of a local store. `k`, `size` and `row_length` never change after init; everything
/// else is touched only by the key's own tasks (the engine runs one at a time per key) and, under
/// `m`, by saving and loading optimizer states.
template <class T>
struct local_entry {
  local_entry(key k_, std::vector<T> v, std::size_t rl)
      : k(std::move(k_)), size(v.size()), row_length(rl), value(std::move(v)) {}

  const key k;
  const std::size_t size;
  const std::size_t row_length;  ///< 0: not a matrix
  std::mutex m;
  std::vector<T> value;
  optim::state<T> state;
  /// The optimizer generation `state` belongs to; an update by another one starts fresh.
  std::uint64_t state_gen = 0;
  /// The key's learning-rate and weight-decay multipliers (set_key_options).
  optim::multipliers mult;
  std::vector<T> scratch;    ///< summed gradients, summed duplicate rows
  std::uint64_t pushes = 0;  ///< pushes applied: the key's version

  std::size_t rows() const noexcept { return row_length ? size / row_length : 0; }
};

/// The store's optimizer, with the generation that tells states of an older one apart.
template <class T>
struct local_optimizer {
  optim::updater<T> u;
  std::uint64_t gen = 0;
};

/// All of a local store, behind one pointer: moving the store moves the pointer, and the
/// engine's tasks (which point into it) never dangle.
template <class T>
struct local_impl {
  using entry = local_entry<T>;
  struct init_item {
    key k;
    std::span<const T> value;
    std::size_t row_length;
  };

  explicit local_impl(const local_options& o) : opts(o), eng(o.threads) {}

  local_options opts;
  std::shared_mutex m;  ///< guards `keys` (the map, not the entries) and `opt`
  std::unordered_map<std::uint64_t, std::unique_ptr<local_entry<T>>> keys;
  std::shared_ptr<const local_optimizer<T>> opt;  ///< null: no optimizer
  std::uint64_t generation = 0;
  engine eng;  ///< last: destroyed first, after it has waited for every op

  /// Small values are copied or summed on the caller's thread when a pool thread is idle: a
  /// hand-off would cost more than the work.
  /// Not with a user callable as the optimizer: it may take any time, or block, and a push must
  /// return at once.
  bool run_inline(std::size_t elements, const local_optimizer<T>* opt = nullptr) const noexcept {
    return elements < opts.parallel_reduce_min && (!opt || !opt->u.name.empty());
  }

  // dst = sum of srcs, over the pool for large values.
  void sum(std::span<T> dst, std::span<const std::span<const T>> srcs) {
    reduce::sum_into<T>(eng, dst, srcs, opts.parallel_reduce_min);
  }
  void copy(std::span<T> dst, std::span<const T> src) {
    sum(dst, std::span<const std::span<const T>>(&src, 1));
  }

  std::shared_ptr<const local_optimizer<T>> current_optimizer() {
    std::shared_lock lk(m);
    return opt;
  }

  // The entry of `k` (m held, shared or not). Throws unknown_key, or invalid_argument when k's
  // id belongs to another name.
  entry& find_locked(std::string_view call, const key& k) const {
    auto it = keys.find(k.id());
    if (it == keys.end()) detail::fail(errc::unknown_key, call, k, "never inited");
    entry& e = *it->second;
    detail::check_same_name(call, e.k, k);
    return e;
  }
  entry& find(std::string_view call, const key& k) {
    std::shared_lock lk(m);
    return find_locked(call, k);
  }
  // The entry of `k` for a range call, the range checked: errors name the key and the range.
  entry& find_range(std::string_view call, const key& k, std::size_t offset, std::size_t n) {
    std::shared_lock lk(m);
    if (!keys.count(k.id()))
      detail::fail(errc::unknown_key, call, k,
                   "never inited (elements " + detail::range_str(offset, n) + ")");
    entry& e = find_locked(call, k);
    detail::check_range(call, e.k, e.size, offset, n);
    return e;
  }

  // Inits the keys of `items`: all of them, or (on any error) none.
  void insert(std::vector<init_item> items) {
    // Copy outside the lock (values may be large), then check and insert all under it.
    std::vector<std::unique_ptr<entry>> made;
    made.reserve(items.size());
    for (auto& it : items)
      made.push_back(std::make_unique<entry>(it.k, std::vector<T>(it.value.begin(), it.value.end()),
                                             it.row_length));
    std::unique_lock lk(m);
    for (std::size_t i = 0; i < made.size(); ++i) {
      const key& k = made[i]->k;
      auto hit = keys.find(k.id());
      bool twice = false;
      for (std::size_t j = 0; j < i && !twice; ++j) twice = made[j]->k.id() == k.id();
      if (hit != keys.end()) {
        detail::check_same_name("init", hit->second->k, k);
        twice = true;
      } else if (twice) {
        for (std::size_t j = 0; j < i; ++j)
          if (made[j]->k.id() == k.id()) detail::check_same_name("init", made[j]->k, k);
      }
      if (twice) detail::fail(errc::already_inited, "init", k, "inited twice");
    }
    for (auto& e : made) {
      const std::uint64_t id = e->k.id();
      keys.emplace(id, std::move(e));
    }
  }
};

}  // namespace kvstore::detail
