// KVStore<local, T>: one process, values from any number of devices summed on the CPU, the
// optimizer applied in place. Self-contained and free of Asio: include it alone for local-only
// code.
#pragma once

#include <kvstore/detail/block_pool.hpp>
#include <kvstore/detail/checks.hpp>
#include <kvstore/detail/group.hpp>
#include <kvstore/engine/engine.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/optim/state_match.hpp>
#include <kvstore/options.hpp>
#include <kvstore/reduce/cpu.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore {

namespace detail {

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
};

}  // namespace detail

/// The local store: one process; values pushed from several devices are summed, then stored, or
/// with an optimizer set, applied to the stored weight as a gradient.
///
/// Every data call checks its arguments before anything is queued and throws kvstore::error
/// (naming the key and the problem) on misuse; a call that throws changes nothing. Push and pull
/// return an `op` at once: the caller keeps input buffers alive and unchanged, and does not read
/// output buffers, until that op is done (op::wait, wait(key), wait_all). Ops on one key take
/// effect in issue order; among ops waiting for a thread, higher priority runs first.
/// Calls may be made from several threads at once.
template <class T>
class KVStore<local, T> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "KVStore<local, T>: T must be float or double");

 public:
  using value_type = T;

  /// A store with default options (one engine thread per core).
  KVStore() : KVStore(local_options{}) {}
  /// A store with the given options.
  explicit KVStore(const local_options& o) : impl_(std::make_unique<detail::local_impl<T>>(o)) {}
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;
  /// Moves the whole store; the moved-from store may only be destroyed or assigned to.
  KVStore(KVStore&&) noexcept = default;
  /// Finishes every op of this store first, then takes over `other`'s.
  KVStore& operator=(KVStore&&) noexcept = default;
  /// Waits for every op issued, then stops the engine.
  ~KVStore() {
    if (impl_) impl_->eng.wait_all();
  }

  /// "local".
  std::string type() const { return "local"; }
  /// Always 0.
  int rank() const noexcept { return 0; }
  /// Always 1.
  int num_workers() const noexcept { return 1; }

  // ---- init ----------------------------------------------------------------------------------

  /// Stores the first value of `k`. Returns once stored.
  /// Throws: already_inited (k inited before), invalid_argument (k's id is taken by another name).
  void init(key k, std::span<const T> value) { init_entries({{std::move(k), value, 0}}); }

  /// Stores the first value of a matrix key: value.size() / row_length rows of row_length
  /// elements, for push_rows / pull_rows. Returns once stored.
  /// Throws as init above, and invalid_argument (row_length 0), size_mismatch (value.size() not a
  /// multiple of row_length).
  void init(key k, std::span<const T> value, std::size_t row_length) {
    detail::check_matrix_init(k, value.size(), row_length);
    init_entries({{std::move(k), value, row_length}});
  }

  /// With init_options: row_length as above; partition and compression place and encode a key
  /// across servers, so one process ignores them (values do not travel).
  void init(key k, std::span<const T> value, const init_options& o) {
    detail::check_compression(o.compression, "init of key " + k.str() + ": init_options");
    if (o.row_length) return init(std::move(k), value, o.row_length);
    init(std::move(k), value);
  }

  /// Inits several keys at once: all of them, or (on any error) none. Returns once stored.
  /// Throws as init, and invalid_argument when ks and values differ in length.
  void init(std::span<const key> ks, std::span<const std::span<const T>> values) {
    detail::check_count("init", ks.size(), "with", values.size(), "values");
    std::vector<init_item> items;
    items.reserve(ks.size());
    for (std::size_t i = 0; i < ks.size(); ++i) items.push_back({ks[i], values[i], 0});
    init_entries(std::move(items));
  }

  // ---- push ----------------------------------------------------------------------------------

  /// Pushes one value: stored as is, or with an optimizer applied as the gradient.
  /// Throws: unknown_key, size_mismatch. Done once the store has taken the value.
  op push(key k, std::span<const T> value, int priority = 0) {
    return push_groups("push", {group_in{&find("push", k), {value}}}, priority);
  }

  /// Pushes the sum of several values (one per device), summed in the order given.
  /// Throws: unknown_key, size_mismatch, invalid_argument (no values).
  op push(key k, std::initializer_list<std::span<const T>> values, int priority = 0) {
    if (values.size() == 0) detail::fail(errc::invalid_argument, "push", k, "no values");
    return push_groups("push", {group_in{&find("push", k), {values.begin(), values.end()}}},
                       priority);
  }

  /// Pushes several keys as one op (one part per key). A key listed several times gets the sum
  /// of its values, as one push. Throws as push, and invalid_argument when ks and values differ
  /// in length; nothing is pushed when any key fails.
  op push(std::span<const key> ks, std::span<const std::span<const T>> values, int priority = 0) {
    detail::check_count("push", ks.size(), "with", values.size(), "values");
    std::vector<group_in> groups;
    {
      std::shared_lock lk(impl_->m);
      groups = detail::group_by_key<entry*>(
          values, [&](std::size_t i) { return &find_locked("push", ks[i]); }, std::equal_to<>{});
    }
    return push_groups("push", std::move(groups), priority);
  }

  // ---- pull ----------------------------------------------------------------------------------

  /// Copies the newest value of `k` (after every earlier push on k) into `out`.
  /// Throws: unknown_key, size_mismatch. Done once `out` holds it.
  op pull(key k, std::span<T> out, int priority = 0) {
    return pull_groups("pull", {group_out{&find("pull", k), {out}}}, priority);
  }

  /// Copies the newest value of `k` into each of `outs`.
  /// Throws: unknown_key, size_mismatch, invalid_argument (no outputs).
  op pull(key k, std::initializer_list<std::span<T>> outs, int priority = 0) {
    if (outs.size() == 0) detail::fail(errc::invalid_argument, "pull", k, "no outputs");
    return pull_groups("pull", {group_out{&find("pull", k), {outs.begin(), outs.end()}}}, priority);
  }

  /// Pulls several keys as one op (one part per key). Throws as pull, and invalid_argument when
  /// ks and outs differ in length; nothing is pulled when any key fails.
  op pull(std::span<const key> ks, std::span<const std::span<T>> outs, int priority = 0) {
    detail::check_count("pull", ks.size(), "into", outs.size(), "outputs");
    std::vector<group_out> groups;
    {
      std::shared_lock lk(impl_->m);
      groups = detail::group_by_key<entry*>(
          outs, [&](std::size_t i) { return &find_locked("pull", ks[i]); }, std::equal_to<>{});
    }
    return pull_groups("pull", std::move(groups), priority);
  }

  /// A push of `value` then a pull into `out`, as one op on the key (nothing runs between).
  /// Throws: unknown_key, size_mismatch. Done once `out` holds the new value.
  op pushpull(key k, std::span<const T> value, std::span<T> out, int priority = 0) {
    auto& e = find("pushpull", k);
    check_size("pushpull", e, value.size());
    check_size("pushpull", e, out.size());
    auto opt = current_optimizer();
    auto st = detail::make_pooled<detail::op_state>(1);
    detail::local_impl<T>* impl = impl_.get();
    std::vector<std::span<const T>> srcs{value};
    impl->eng.submit_sync(
        e.k.id(), priority,
        [impl, ep = &e, srcs = std::move(srcs), opt, out] {
          std::lock_guard lk(ep->m);
          push_task(*impl, *ep, srcs, opt.get());
          impl->copy(out, ep->value);
        },
        st, impl_->run_inline(e.size, opt.get()));
    return op(std::move(st));
  }

  // ---- rows ----------------------------------------------------------------------------------

  /// Pushes rows of a matrix key: values holds rows.size() * row_length elements, row after row.
  /// Rows named twice are summed first. With no optimizer the rows are stored; with one, they are
  /// gradients of those rows only (the key's step count advances once per call).
  /// Throws: unknown_key, not_a_matrix, row_out_of_range, invalid_argument (values.size() is not
  /// rows.size() * row_length). Done once the store has taken the rows.
  op push_rows(key k, std::span<const std::int64_t> rows, std::span<const T> values,
               int priority = 0) {
    auto& e = find("push_rows", k);
    check_rows("push_rows", e, rows, values.size());
    auto opt = current_optimizer();
    auto st = detail::make_pooled<detail::op_state>(1);
    detail::local_impl<T>* impl = impl_.get();
    impl->eng.submit_sync(
        e.k.id(), priority,
        [ep = &e, rows, values, opt] {
          std::lock_guard lk(ep->m);
          push_rows_task(*ep, rows, values, opt.get());
        },
        st, impl_->run_inline(e.size, opt.get()));
    return op(std::move(st));
  }

  /// Copies rows of a matrix key, in the order named (repeats allowed), into `out`
  /// (rows.size() * row_length elements). Throws as push_rows. Done once `out` holds them.
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out, int priority = 0) {
    auto& e = find("pull_rows", k);
    check_rows("pull_rows", e, rows, out.size());
    auto st = detail::make_pooled<detail::op_state>(1);
    impl_->eng.submit_sync(
        e.k.id(), priority,
        [ep = &e, rows, out] {
          std::lock_guard lk(ep->m);
          const std::size_t rl = ep->row_length;
          for (std::size_t i = 0; i < rows.size(); ++i)
            std::copy_n(ep->value.data() + static_cast<std::size_t>(rows[i]) * rl, rl,
                        out.data() + i * rl);
        },
        st, impl_->run_inline(e.size));
    return op(std::move(st));
  }

  // ---- placement and element ranges ---------------------------------------------------------

  /// (start, length) of key k's elements on server `server`: one process is server 0 and holds
  /// (0, size). Throws unknown_key, invalid_argument (a server other than 0).
  std::pair<std::size_t, std::size_t> slice_of(key k, int server) const {
    auto& e = find("slice_of", k);
    if (server != 0)
      detail::fail(
          errc::invalid_argument, "slice_of", k,
          "server " + std::to_string(server) + " is out of range (a local store is one server, 0)");
    return {0, e.size};
  }

  /// Pushes elements [offset, offset + values.size()) of the key: stored, or with an optimizer
  /// the gradient of those elements only (the key's step count advances once). Throws
  /// unknown_key, invalid_argument (an empty range), size_mismatch (past the key's end), naming
  /// the key and the range. Done once the store has taken them.
  op push_range(key k, std::size_t offset, std::span<const T> values, int priority = 0) {
    auto& e = find_range("push_range", k, offset, values.size());
    auto opt = current_optimizer();
    auto st = detail::make_pooled<detail::op_state>(1);
    impl_->eng.submit_sync(
        e.k.id(), priority,
        [ep = &e, offset, values, opt] {
          std::lock_guard lk(ep->m);
          push_range_task(*ep, offset, values, opt.get());
        },
        st, impl_->run_inline(values.size(), opt.get()));
    return op(std::move(st));
  }

  /// Copies elements [offset, offset + out.size()) of the key into `out`. Throws as push_range.
  op pull_range(key k, std::size_t offset, std::span<T> out, int priority = 0) {
    auto& e = find_range("pull_range", k, offset, out.size());
    auto st = detail::make_pooled<detail::op_state>(1);
    impl_->eng.submit_sync(
        e.k.id(), priority,
        [ep = &e, offset, out] {
          std::lock_guard lk(ep->m);
          std::copy_n(ep->value.data() + offset, out.size(), out.data());
        },
        st, impl_->run_inline(out.size()));
    return op(std::move(st));
  }

  // ---- versions (an addition to the contract: SINGA's param versions) ------------------------

  /// Pushes applied to `k` (push, push_rows, pushpull: one each, whatever the number of values
  /// summed), after every op issued on `k` before this call. Throws: unknown_key.
  std::uint64_t version(key k) {
    auto& e = find("version", k);
    impl_->eng.wait_key(e.k.id());
    std::lock_guard lk(e.m);
    return e.pushes;
  }

  // ---- waiting -------------------------------------------------------------------------------

  /// Returns once every op issued on `k` before this call is done (a key never used: at once).
  /// Errors of those ops are reported by their op::wait, not here.
  void wait(key k) { impl_->eng.wait_key(k.id()); }
  /// Returns once every op issued before this call is done.
  void wait_all() { impl_->eng.wait_all(); }

  // ---- optimizers ----------------------------------------------------------------------------

  /// Sets a registered optimizer (optim::sgd, optim::adam, optim::adagrad, optim::add, or any type
  /// meeting optim::registered_optimizer). Waits for every op in flight first. The same type
  /// again (new parameters: a learning-rate schedule) keeps every key's state (momentum, moments,
  /// step count); another type starts fresh. Later pushes are gradients.
  template <optim::registered_optimizer O>
  void set_optimizer(const O& o) {
    install(optim::make_updater<T>(o));
  }

  /// Sets a callable `(kvstore::key, std::span<const T> grad, std::span<T> weight)` as the
  /// optimizer (local mode only; it has no state to save). It may be called from several engine
  /// threads at once for different keys, never twice at once for one key. Waits as above; states
  /// start fresh.
  template <class F>
  requires(!optim::registered_optimizer<std::remove_cvref_t<F>> &&
           optim::callable_optimizer<std::remove_cvref_t<F>, T>) void set_optimizer(F&& f) {
    install(optim::from_callable<T>(std::remove_cvref_t<F>(std::forward<F>(f))));
  }

  /// Sets an already type-erased optimizer (as optim::make_updater / create_updater build).
  /// Throws invalid_argument for an empty updater. Waits as above.
  void set_optimizer(optim::updater<T> u) {
    if (!u) throw error(errc::invalid_argument, "kvstore: set_optimizer: empty updater");
    install(std::move(u));
  }

  /// Scales the learning rate and weight decay of `k`'s updates (MXNet's lr_mult and wd_mult):
  /// the built-in optimizers use learning_rate * lr_mult and weight_decay * wd_mult for this key.
  /// Applies to ops issued after it (it waits for the key's ops in flight). Throws unknown_key,
  /// invalid_argument (a multiplier that is not finite).
  void set_key_options(key k, const key_options& o) {
    detail::check_multipliers("set_key_options", k, o.lr_mult, o.wd_mult);
    entry& e = find("set_key_options", k);
    wait(k);
    std::lock_guard lk(e.m);
    e.mult = {o.lr_mult, o.wd_mult};
  }

  /// Writes every key's optimizer state to `path` (atomically: the old file stays whole if this
  /// fails), after waiting for every op in flight. With no optimizer, or a callable one, the file
  /// names no optimizer and holds only step counts. Throws: io_error.
  void save_optimizer_states(const std::filesystem::path& path) {
    impl_->eng.wait_all();
    std::map<std::uint64_t, optim::key_state<T>> states;
    std::string name;
    {
      std::shared_lock lk(impl_->m);
      const std::uint64_t gen = impl_->opt ? impl_->opt->gen : 0;
      if (impl_->opt) name = impl_->opt->u.name;
      for (auto& [id, e] : impl_->keys) {
        std::lock_guard elk(e->m);
        if (e->state_gen != gen || (e->state.step == 0 && e->state.slots.empty())) continue;
        states.emplace(id, optim::key_state<T>{e->k.name(), e->state});
      }
    }
    optim::save_states<T>(path, name, states);
  }

  /// Replaces every key's optimizer state with the one saved in `path` (a key the file does not
  /// name starts fresh), after waiting for every op in flight. The file must have been saved for
  /// an optimizer of the same name as the current one (none: an unnamed file). All-or-nothing:
  /// Throws io_error, bad_file (wrong, truncated or corrupt file, another optimizer or element
  /// type), unknown_key (a key this store does not have), size_mismatch (a state of another size
  /// than its key), and then no state has changed.
  void load_optimizer_states(const std::filesystem::path& path) {
    impl_->eng.wait_all();
    const auto keep = current_optimizer();
    const auto* opt = keep.get();
    // Read and validate the whole file before looking at (and long before changing) any key.
    auto loaded = optim::load_states<T>(path, opt ? std::string_view(opt->u.name) : "");
    std::shared_lock lk(impl_->m);
    const std::size_t slots = opt ? static_cast<std::size_t>(opt->u.num_slots) : 0;
    const auto found = optim::match_states<T>(loaded, impl_->keys, slots);
    const std::uint64_t gen = opt ? opt->gen : 0;
    for (auto& [id, e] : impl_->keys) {
      std::lock_guard elk(e->m);
      e->state = {};
      e->state_gen = gen;
    }
    for (auto& [e, ks] : found) {
      std::lock_guard elk(e->m);
      e->state = std::move(ks->st);
    }
  }

  // ---- the cluster (local: trivial) ----------------------------------------------------------

  /// No other worker: returns at once.
  void barrier() {}
  /// No other node: always 0.
  int num_dead_node(int /*node_id*/, int /*timeout_sec*/ = 60) const { return 0; }
  /// No servers in local mode. Throws: unsupported.
  void send_command_to_servers(int /*head*/, std::string_view /*body*/) {
    throw error(errc::unsupported,
                "kvstore: send_command_to_servers is a dist call; a local store has no servers");
  }
  /// No other worker: no effect.
  void set_barrier_before_exit(bool /*on*/) {}
  /// Values do not travel in one process: checks `c` as KVStore<dist> does (invalid_argument
  /// for a type out of range or a two_bit threshold that is not finite and > 0), changes nothing.
  void set_gradient_compression(const compression& c) {
    detail::check_compression(c, "set_gradient_compression");
  }

 private:
  using entry = detail::local_entry<T>;
  struct init_item {
    key k;
    std::span<const T> value;
    std::size_t row_length;
  };
  // One key of a call and its buffers (detail/group.hpp): h is the key's entry.
  using group_in = detail::key_group<entry*, std::span<const T>>;
  using group_out = detail::key_group<entry*, std::span<T>>;

  std::shared_ptr<const detail::local_optimizer<T>> current_optimizer() const {
    std::shared_lock lk(impl_->m);
    return impl_->opt;
  }

  // The entry of `k` (impl_->m held, shared or not). Throws unknown_key, or invalid_argument when
  // k's id belongs to another name.
  entry& find_locked(std::string_view call, const key& k) const {
    auto it = impl_->keys.find(k.id());
    if (it == impl_->keys.end()) detail::fail(errc::unknown_key, call, k, "never inited");
    entry& e = *it->second;
    check_same_name(call, e.k, k);
    return e;
  }
  entry& find(std::string_view call, const key& k) const {
    std::shared_lock lk(impl_->m);
    return find_locked(call, k);
  }
  // The entry of `k` for a range call, the range checked: errors name the key and the range.
  entry& find_range(std::string_view call, const key& k, std::size_t offset, std::size_t n) const {
    std::shared_lock lk(impl_->m);
    if (!impl_->keys.count(k.id()))
      detail::fail(errc::unknown_key, call, k,
                   "never inited (elements " + detail::range_str(offset, n) + ")");
    entry& e = find_locked(call, k);
    detail::check_range(call, e.k, e.size, offset, n);
    return e;
  }
  static void check_same_name(std::string_view call, const key& have, const key& k) {
    detail::check_same_name(call, have, k);
  }
  static void check_size(std::string_view call, const entry& e, std::size_t n) {
    detail::check_size(call, e.k, e.size, n);
  }
  static void check_rows(std::string_view call, const entry& e, std::span<const std::int64_t> rows,
                         std::size_t n) {
    detail::check_rows(call, e.k, e.size, e.row_length, rows, n);
  }

  void init_entries(std::vector<init_item> items) {
    // Copy outside the lock (values may be large), then check and insert all under it.
    std::vector<std::unique_ptr<entry>> made;
    made.reserve(items.size());
    for (auto& it : items)
      made.push_back(std::make_unique<entry>(it.k, std::vector<T>(it.value.begin(), it.value.end()),
                                             it.row_length));
    std::unique_lock lk(impl_->m);
    for (std::size_t i = 0; i < made.size(); ++i) {
      const key& k = made[i]->k;
      auto hit = impl_->keys.find(k.id());
      bool twice = false;
      for (std::size_t j = 0; j < i && !twice; ++j) twice = made[j]->k.id() == k.id();
      if (hit != impl_->keys.end()) {
        check_same_name("init", hit->second->k, k);
        twice = true;
      } else if (twice) {
        for (std::size_t j = 0; j < i; ++j)
          if (made[j]->k.id() == k.id()) check_same_name("init", made[j]->k, k);
      }
      if (twice) detail::fail(errc::already_inited, "init", k, "inited twice");
    }
    for (auto& e : made) {
      const std::uint64_t id = e->k.id();
      impl_->keys.emplace(id, std::move(e));
    }
  }

  op push_groups(std::string_view call, std::vector<group_in> groups, int priority) {
    for (auto& g : groups)
      for (auto& s : g.bufs) check_size(call, *g.h, s.size());
    if (groups.empty()) return op::done();
    auto opt = current_optimizer();
    auto st = detail::make_pooled<detail::op_state>(groups.size());
    detail::local_impl<T>* impl = impl_.get();
    for (auto& g : groups) {
      impl->eng.submit_sync(
          g.h->k.id(), priority,
          [impl, ep = g.h, srcs = std::move(g.bufs), opt] {
            std::lock_guard lk(ep->m);
            push_task(*impl, *ep, srcs, opt.get());
          },
          st, impl_->run_inline(g.h->size, opt.get()));
    }
    return op(std::move(st));
  }

  op pull_groups(std::string_view call, std::vector<group_out> groups, int priority) {
    for (auto& g : groups)
      for (auto& o : g.bufs) check_size(call, *g.h, o.size());
    if (groups.empty()) return op::done();
    auto st = detail::make_pooled<detail::op_state>(groups.size());
    detail::local_impl<T>* impl = impl_.get();
    for (auto& g : groups) {
      impl->eng.submit_sync(
          g.h->k.id(), priority,
          [impl, ep = g.h, outs = std::move(g.bufs)] {
            std::lock_guard lk(ep->m);
            for (auto o : outs) impl->copy(o, ep->value);
          },
          st, impl_->run_inline(g.h->size));
    }
    return op(std::move(st));
  }

  // The state of `e` for optimizer `o`: a fresh one if it belonged to another optimizer.
  static optim::state<T>& state_for(entry& e, const detail::local_optimizer<T>& o) {
    if (e.state_gen != o.gen) {
      e.state = {};
      e.state_gen = o.gen;
    }
    return e.state;
  }

  // Runs in the key's task, e.m held.
  static void push_task(detail::local_impl<T>& impl, entry& e,
                        const std::vector<std::span<const T>>& srcs,
                        const detail::local_optimizer<T>* opt) {
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
    opt->u.apply(e.k, grad, e.value, state_for(e, *opt), e.mult);
  }

  // Runs in the key's task, e.m held. Rows are taken in ascending order; a row named several
  // times is the sum of its values in the order given.
  static void push_rows_task(entry& e, std::span<const std::int64_t> rows,
                             std::span<const T> values, const detail::local_optimizer<T>* opt) {
    ++e.pushes;
    const std::size_t rl = e.row_length;
    std::vector<std::size_t> order(rows.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    if (!std::is_sorted(rows.begin(), rows.end()))
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return rows[a] < rows[b]; });
    optim::state<T>* st = nullptr;
    if (opt) {
      st = &state_for(e, *opt);
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
  static void push_range_task(entry& e, std::size_t offset, std::span<const T> values,
                              const detail::local_optimizer<T>* opt) {
    ++e.pushes;  // a push of some elements: one version
    std::span<T> w(e.value.data() + offset, values.size());
    if (!opt) {
      std::copy(values.begin(), values.end(), w.begin());
      return;
    }
    auto& st = state_for(e, *opt);
    opt->u.ensure_state(st, e.size);
    ++st.step;
    opt->u.fn(e.k, values, w, optim::updater<T>::view(st, offset, values.size(), e.mult));
  }

  void install(optim::updater<T> u) {
    impl_->eng.wait_all();
    std::unique_lock lk(impl_->m);
    // The same registered type keeps the states' generation, so they carry on with the new
    // parameters; a callable or another type starts a new one.
    const bool same = impl_->opt && !u.name.empty() && impl_->opt->u.name == u.name;
    const std::uint64_t gen = same ? impl_->opt->gen : ++impl_->generation;
    impl_->opt = std::make_shared<const detail::local_optimizer<T>>(
        detail::local_optimizer<T>{std::move(u), gen});
  }

  std::unique_ptr<detail::local_impl<T>> impl_;
};

}  // namespace kvstore
