// KVStore<local, T>: one process, values from any number of devices summed on the CPU, the
// optimizer applied in place. Self-contained and free of Asio: include it alone for local-only
// code. This file is the API: each call checks its arguments and queues its keys' work on the
// engine; the keys are local/store_state.hpp, what a push does to one local/updates.hpp, the
// optimizer and its saved states local/states.hpp.
#pragma once

#include <kvstore/detail/block_pool.hpp>
#include <kvstore/detail/checks.hpp>
#include <kvstore/detail/group.hpp>
#include <kvstore/engine/engine.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/local/states.hpp>
#include <kvstore/local/store_state.hpp>
#include <kvstore/local/updates.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore {

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
  void init(key k, std::span<const T> value) { impl_->insert({{std::move(k), value, 0}}); }

  /// Stores the first value of a matrix key: value.size() / row_length rows of row_length
  /// elements, for push_rows / pull_rows. Returns once stored.
  /// Throws as init above, and invalid_argument (row_length 0), size_mismatch (value.size() not a
  /// multiple of row_length).
  void init(key k, std::span<const T> value, std::size_t row_length) {
    detail::check_matrix_init(k, value.size(), row_length);
    impl_->insert({{std::move(k), value, row_length}});
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
    impl_->insert(std::move(items));
  }

  // ---- push ----------------------------------------------------------------------------------

  /// Pushes one value: stored as is, or with an optimizer applied as the gradient.
  /// Throws: unknown_key, size_mismatch. Done once the store has taken the value.
  op push(key k, std::span<const T> value, int priority = 0) {
    return push_groups("push", {group_in{&impl_->find("push", k), {value}}}, priority);
  }

  /// Pushes the sum of several values (one per device), summed in the order given.
  /// Throws: unknown_key, size_mismatch, invalid_argument (no values).
  op push(key k, std::initializer_list<std::span<const T>> values, int priority = 0) {
    if (values.size() == 0) detail::fail(errc::invalid_argument, "push", k, "no values");
    return push_groups("push", {group_in{&impl_->find("push", k), {values.begin(), values.end()}}},
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
          values, [&](std::size_t i) { return &impl_->find_locked("push", ks[i]); },
          std::equal_to<>{});
    }
    return push_groups("push", std::move(groups), priority);
  }

  // ---- pull ----------------------------------------------------------------------------------

  /// Copies the newest value of `k` (after every earlier push on k) into `out`.
  /// Throws: unknown_key, size_mismatch. Done once `out` holds it.
  op pull(key k, std::span<T> out, int priority = 0) {
    return pull_groups("pull", {group_out{&impl_->find("pull", k), {out}}}, priority);
  }

  /// Copies the newest value of `k` into each of `outs`.
  /// Throws: unknown_key, size_mismatch, invalid_argument (no outputs).
  op pull(key k, std::initializer_list<std::span<T>> outs, int priority = 0) {
    if (outs.size() == 0) detail::fail(errc::invalid_argument, "pull", k, "no outputs");
    return pull_groups("pull", {group_out{&impl_->find("pull", k), {outs.begin(), outs.end()}}},
                       priority);
  }

  /// Pulls several keys as one op (one part per key). Throws as pull, and invalid_argument when
  /// ks and outs differ in length; nothing is pulled when any key fails.
  op pull(std::span<const key> ks, std::span<const std::span<T>> outs, int priority = 0) {
    detail::check_count("pull", ks.size(), "into", outs.size(), "outputs");
    std::vector<group_out> groups;
    {
      std::shared_lock lk(impl_->m);
      groups = detail::group_by_key<entry*>(
          outs, [&](std::size_t i) { return &impl_->find_locked("pull", ks[i]); },
          std::equal_to<>{});
    }
    return pull_groups("pull", std::move(groups), priority);
  }

  /// A push of `value` then a pull into `out`, as one op on the key (nothing runs between).
  /// Throws: unknown_key, size_mismatch. Done once `out` holds the new value.
  op pushpull(key k, std::span<const T> value, std::span<T> out, int priority = 0) {
    auto& e = impl_->find("pushpull", k);
    check_size("pushpull", e, value.size());
    check_size("pushpull", e, out.size());
    auto opt = impl_->current_optimizer();
    auto st = detail::make_pooled<detail::op_state>(1);
    detail::local_impl<T>* impl = impl_.get();
    std::vector<std::span<const T>> srcs{value};
    impl->eng.submit_sync(
        e.k.id(), priority,
        [impl, ep = &e, srcs = std::move(srcs), opt, out] {
          std::lock_guard lk(ep->m);
          detail::local_push_task<T>(*impl, *ep, srcs, opt.get());
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
    auto& e = impl_->find("push_rows", k);
    check_rows("push_rows", e, rows, values.size());
    auto opt = impl_->current_optimizer();
    auto st = detail::make_pooled<detail::op_state>(1);
    detail::local_impl<T>* impl = impl_.get();
    impl->eng.submit_sync(
        e.k.id(), priority,
        [ep = &e, rows, values, opt] {
          std::lock_guard lk(ep->m);
          detail::local_push_rows_task<T>(*ep, rows, values, opt.get());
        },
        st, impl_->run_inline(e.size, opt.get()));
    return op(std::move(st));
  }

  /// Copies rows of a matrix key, in the order named (repeats allowed), into `out`
  /// (rows.size() * row_length elements). Throws as push_rows. Done once `out` holds them.
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out, int priority = 0) {
    auto& e = impl_->find("pull_rows", k);
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
    auto& e = impl_->find("slice_of", k);
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
    auto& e = impl_->find_range("push_range", k, offset, values.size());
    auto opt = impl_->current_optimizer();
    auto st = detail::make_pooled<detail::op_state>(1);
    impl_->eng.submit_sync(
        e.k.id(), priority,
        [ep = &e, offset, values, opt] {
          std::lock_guard lk(ep->m);
          detail::local_push_range_task<T>(*ep, offset, values, opt.get());
        },
        st, impl_->run_inline(values.size(), opt.get()));
    return op(std::move(st));
  }

  /// Copies elements [offset, offset + out.size()) of the key into `out`. Throws as push_range.
  op pull_range(key k, std::size_t offset, std::span<T> out, int priority = 0) {
    auto& e = impl_->find_range("pull_range", k, offset, out.size());
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
    auto& e = impl_->find("version", k);
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
    entry& e = impl_->find("set_key_options", k);
    wait(k);
    std::lock_guard lk(e.m);
    e.mult = {o.lr_mult, o.wd_mult};
  }

  /// Writes every key's optimizer state to `path` (atomically: the old file stays whole if this
  /// fails), after waiting for every op in flight. With no optimizer, or a callable one, the file
  /// names no optimizer and holds only step counts. Throws: io_error.
  void save_optimizer_states(const std::filesystem::path& path) {
    impl_->eng.wait_all();
    detail::save_local_states(*impl_, path);
  }

  /// Replaces every key's optimizer state with the one saved in `path` (a key the file does not
  /// name starts fresh), after waiting for every op in flight. The file must have been saved for
  /// an optimizer of the same name as the current one (none: an unnamed file). All-or-nothing:
  /// Throws io_error, bad_file (wrong, truncated or corrupt file, another optimizer or element
  /// type), unknown_key (a key this store does not have), size_mismatch (a state of another size
  /// than its key), and then no state has changed.
  void load_optimizer_states(const std::filesystem::path& path) {
    impl_->eng.wait_all();
    detail::load_local_states(*impl_, path);
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
  using init_item = typename detail::local_impl<T>::init_item;
  // One key of a call and its buffers (detail/group.hpp): h is the key's entry.
  using group_in = detail::key_group<entry*, std::span<const T>>;
  using group_out = detail::key_group<entry*, std::span<T>>;

  static void check_size(std::string_view call, const entry& e, std::size_t n) {
    detail::check_size(call, e.k, e.size, n);
  }
  static void check_rows(std::string_view call, const entry& e, std::span<const std::int64_t> rows,
                         std::size_t n) {
    detail::check_rows(call, e.k, e.size, e.row_length, rows, n);
  }

  op push_groups(std::string_view call, std::vector<group_in> groups, int priority) {
    for (auto& g : groups)
      for (auto& s : g.bufs) check_size(call, *g.h, s.size());
    if (groups.empty()) return op::done();
    auto opt = impl_->current_optimizer();
    auto st = detail::make_pooled<detail::op_state>(groups.size());
    detail::local_impl<T>* impl = impl_.get();
    for (auto& g : groups) {
      impl->eng.submit_sync(
          g.h->k.id(), priority,
          [impl, ep = g.h, srcs = std::move(g.bufs), opt] {
            std::lock_guard lk(ep->m);
            detail::local_push_task<T>(*impl, *ep, srcs, opt.get());
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

  void install(optim::updater<T> u) {
    impl_->eng.wait_all();
    detail::install_local_optimizer(*impl_, std::move(u));
  }

  std::unique_ptr<detail::local_impl<T>> impl_;
};

}  // namespace kvstore
