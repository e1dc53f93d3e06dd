// KVStore<device, T>: values on devices. Each key lives on one owner device (its value, its
// optimizer state, its updates); a push of several devices' values is one fused kernel on the
// owner that sums them and stores the sum or applies the optimizer in the same pass; a pull is a
// copy (a broadcast, for several outputs) from the owner. This file is the API; its base
// (device/calls.hpp) checks the arguments (detail/checks.hpp, device/checks.hpp) and hands the
// work to the key's task (device/store_state.hpp), which issues it (device/push_pull.hpp,
// device/rows.hpp) on the owner's streams; an op is done when the stream gets there
// (device/completion.hpp).
#pragma once

#include <kvstore/detail/checks.hpp>
#include <kvstore/device/calls.hpp>
#include <kvstore/device/checks.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/device/states.hpp>
#include <kvstore/device/store_state.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore {

/// The device store: every call of KVStore<local>, with device_span<const T> / device_span<T>
/// wherever local takes a std::span (host spans are accepted too). A push of several values is
/// their sum, stored on the key's owner device, or with an optimizer applied there as the
/// gradient; a pull to several outputs gives each the value.
///
/// Checks happen at the call, before anything is queued, and throw kvstore::error naming the key:
/// unknown_key, size_mismatch, already_inited, not_a_matrix, row_out_of_range, invalid_argument
/// (among others: a device that is not one of the store's, or memory that is not on the device a
/// device_span states); a call that throws changes nothing. A device failure while the work runs
/// is an errc::device_error naming the key and the device, thrown by op::wait.
/// Completion rule as KVStore<local>: the caller keeps inputs alive and unchanged and does not
/// read outputs until the op is done (op::wait, wait(key), wait_all). An op is done when its
/// device work is done; stream_wait(k, s) makes a stream of the caller wait for it instead, on
/// the device. Ops on one key take effect in issue order; an op with priority > 0 runs on the
/// device's high-priority stream.
template <class T>
class KVStore<device, T> : detail::device_calls<T> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "KVStore<device, T>: T must be float or double");

 public:
  using value_type = T;

  /// A store over device 0.
  KVStore() : KVStore(device_options{}) {}
  /// A store over o.devices. Throws invalid_argument (no devices, a repeated or negative one, one
  /// that does not exist) or device_error (a stream could not be made).
  explicit KVStore(const device_options& o) : detail::device_calls<T>(o) {}
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;
  KVStore(KVStore&&) noexcept = default;
  KVStore& operator=(KVStore&&) noexcept = default;
  /// Waits for every op issued (and its device work), then frees the keys' memory.
  ~KVStore() = default;

  /// "device".
  std::string type() const { return "device"; }
  int rank() const noexcept { return 0; }
  int num_workers() const noexcept { return 1; }
  /// The store's devices, in the order given.
  const std::vector<int>& devices() const noexcept { return impl_->opts.devices; }
  /// The device that owns `k`. Throws unknown_key.
  int owner(key k) const { return impl_->find("owner", k).owner; }

  // ---- init ----------------------------------------------------------------------------------

  /// Stores the first value of `k` on its owner device. Returns once stored.
  /// Throws: already_inited, invalid_argument (bad device, id taken by another name).
  void init(key k, device_span<const T> value) { init_one(std::move(k), value, 0); }
  void init(key k, std::span<const T> value) { init_one(std::move(k), value, 0); }
  /// A matrix key of value.size() / row_length rows (push_rows / pull_rows). Throws as init, and
  /// invalid_argument (row_length 0), size_mismatch (size not a multiple of row_length).
  void init(key k, device_span<const T> value, std::size_t row_length) {
    detail::check_matrix_init(k, value.size, row_length);
    init_one(std::move(k), value, row_length);
  }
  void init(key k, std::span<const T> value, std::size_t row_length) {
    detail::check_matrix_init(k, value.size(), row_length);
    init_one(std::move(k), value, row_length);
  }
  /// With init_options: row_length as above; partition and compression place and encode a key
  /// across servers, so one process ignores them (values do not travel).
  void init(key k, device_span<const T> value, const init_options& o) {
    detail::check_compression(o.compression, "init of key " + k.str() + ": init_options");
    if (o.row_length) return init(std::move(k), value, o.row_length);
    init(std::move(k), value);
  }
  void init(key k, std::span<const T> value, const init_options& o) {
    detail::check_compression(o.compression, "init of key " + k.str() + ": init_options");
    if (o.row_length) return init(std::move(k), value, o.row_length);
    init(std::move(k), value);
  }
  /// Several keys at once: all or (on any error) none.
  void init(std::span<const key> ks, std::span<const device_span<const T>> values) {
    init_many(ks, values);
  }
  void init(std::span<const key> ks, std::span<const std::span<const T>> values) {
    init_many(ks, values);
  }

  // ---- push ----------------------------------------------------------------------------------

  /// Pushes one value. Throws: unknown_key, size_mismatch, invalid_argument (device).
  op push(key k, device_span<const T> value, int priority = 0) {
    return push_list(k, std::span<const device_span<const T>>(&value, 1), priority);
  }
  op push(key k, std::span<const T> value, int priority = 0) {
    return push_list(k, std::span<const std::span<const T>>(&value, 1), priority);
  }
  /// Pushes the sum of several values (one per device), summed in the order given.
  op push(key k, std::initializer_list<device_span<const T>> values, int priority = 0) {
    return push_list(k, std::span<const device_span<const T>>(values.begin(), values.size()),
                     priority);
  }
  op push(key k, std::initializer_list<std::span<const T>> values, int priority = 0) {
    return push_list(k, std::span<const std::span<const T>>(values.begin(), values.size()),
                     priority);
  }
  /// The sum of any number of values (a vector of device_span, say).
  op push(key k, std::span<const device_span<const T>> values, int priority = 0) {
    return push_list(k, values, priority);
  }
  /// Several keys as one op; a key listed several times gets the sum of its values.
  op push(std::span<const key> ks, std::span<const device_span<const T>> values, int priority = 0) {
    return push_many(ks, values, priority);
  }
  op push(std::span<const key> ks, std::span<const std::span<const T>> values, int priority = 0) {
    return push_many(ks, values, priority);
  }

  // ---- pull ----------------------------------------------------------------------------------

  /// Copies the newest value of `k` into `out`. Throws: unknown_key, size_mismatch,
  /// invalid_argument.
  op pull(key k, device_span<T> out, int priority = 0) {
    return pull_list(k, std::span<const device_span<T>>(&out, 1), priority);
  }
  op pull(key k, std::span<T> out, int priority = 0) {
    return pull_list(k, std::span<const std::span<T>>(&out, 1), priority);
  }
  /// Broadcasts the newest value of `k` from its owner to each of `outs`.
  op pull(key k, std::initializer_list<device_span<T>> outs, int priority = 0) {
    return pull_list(k, std::span<const device_span<T>>(outs.begin(), outs.size()), priority);
  }
  op pull(key k, std::initializer_list<std::span<T>> outs, int priority = 0) {
    return pull_list(k, std::span<const std::span<T>>(outs.begin(), outs.size()), priority);
  }
  op pull(key k, std::span<const device_span<T>> outs, int priority = 0) {
    return pull_list(k, outs, priority);
  }
  /// Several keys as one op.
  op pull(std::span<const key> ks, std::span<const device_span<T>> outs, int priority = 0) {
    return pull_many(ks, outs, priority);
  }
  op pull(std::span<const key> ks, std::span<const std::span<T>> outs, int priority = 0) {
    return pull_many(ks, outs, priority);
  }

  /// A push of `value`, then a pull into `out`, as one op on the key.
  op pushpull(key k, device_span<const T> value, device_span<T> out, int priority = 0) {
    return pushpull_impl(k, value, out, priority);
  }
  op pushpull(key k, std::span<const T> value, std::span<T> out, int priority = 0) {
    return pushpull_impl(k, value, out, priority);
  }

  // ---- rows ----------------------------------------------------------------------------------

  /// Pushes rows of a matrix key (rows on the host; values rows.size() * row_length elements).
  /// Rows named twice are summed first; with an optimizer, they are gradients of those rows only.
  /// Throws: unknown_key, not_a_matrix, row_out_of_range, invalid_argument.
  op push_rows(key k, std::span<const std::int64_t> rows, device_span<const T> values,
               int priority = 0) {
    return push_rows_impl(k, rows, values, priority);
  }
  op push_rows(key k, std::span<const std::int64_t> rows, std::span<const T> values,
               int priority = 0) {
    return push_rows_impl(k, rows, values, priority);
  }
  /// Copies rows of a matrix key, in the order named, into `out`. Throws as push_rows.
  op pull_rows(key k, std::span<const std::int64_t> rows, device_span<T> out, int priority = 0) {
    return pull_rows_impl(k, rows, out, priority);
  }
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out, int priority = 0) {
    return pull_rows_impl(k, rows, out, priority);
  }

  // ---- waiting -------------------------------------------------------------------------------

  /// Returns once every op issued on `k` before this call is done, device work included.
  void wait(key k) { impl_->wait_key(k); }
  /// Returns once every op issued before this call is done, device work included.
  void wait_all() { impl_->wait_all(); }
  /// Makes `consumer` (a stream of the caller's) wait, on the device, for every op issued on `k`
  /// before this call; the host waits only until those ops have been issued to their streams.
  void stream_wait(key k, device_stream consumer) {
    impl_->eng.wait_key(k.id());
    auto& e = impl_->find("stream_wait", k);
    std::lock_guard lk(e.m);
    if (e.last_stream)
      detail::on_device("stream_wait", e.k, e.owner, [&] {
        detail::rt::device_guard g(e.owner);
        detail::rt::event_record(e.done, e.last_stream);
        detail::rt::stream_wait_event(consumer, e.done);
      });
  }

  // ---- optimizers ----------------------------------------------------------------------------

  /// Sets a registered optimizer. sgd, adam and adagrad run fused into the push kernel on the
  /// owner device; any other registered type is applied on host copies of the key's value,
  /// gradient and state (correct, slow). Waits for every op in flight. The same type again (new
  /// parameters: a learning-rate schedule) keeps every key's state; another type starts fresh.
  template <optim::registered_optimizer O>
  void set_optimizer(const O& o) {
    install(optim::make_updater<T>(o));
  }
  /// Sets a callable `(kvstore::key, std::span<const T> grad, std::span<T> weight)`, applied on
  /// host copies of the summed gradient and the weight (both host memory), then copied back.
  template <class F>
  requires(!optim::registered_optimizer<std::remove_cvref_t<F>> &&
           optim::callable_optimizer<std::remove_cvref_t<F>, T>) void set_optimizer(F&& f) {
    install(optim::from_callable<T>(std::remove_cvref_t<F>(std::forward<F>(f))));
  }
  /// Sets a type-erased optimizer (fused when its name is sgd, adam or adagrad).
  void set_optimizer(optim::updater<T> u) {
    if (!u) throw error(errc::invalid_argument, "kvstore: set_optimizer: empty updater");
    install(std::move(u));
  }

  /// Values do not travel in a device store: checks `c` (a known type; for two_bit a positive,
  /// finite threshold) and changes nothing. Throws invalid_argument.
  void set_gradient_compression(const compression& c) {
    detail::check_compression(c, "set_gradient_compression");
  }

  /// Scales the learning rate and weight decay of `k`'s updates (MXNet's lr_mult and wd_mult),
  /// in the fused kernels as on the host; for ops issued after it (it waits for the key's ops in
  /// flight). Throws unknown_key, invalid_argument (a multiplier that is not finite).
  void set_key_options(key k, const key_options& o) {
    detail::check_multipliers("set_key_options", k, o.lr_mult, o.wd_mult);
    auto& e = impl_->find("set_key_options", k);
    impl_->eng.wait_key(e.k.id());
    std::lock_guard lk(e.m);
    e.mult = {o.lr_mult, o.wd_mult};
  }

  /// Pushes applied to `k` (push, push_rows, pushpull: one each), after every op issued on `k`
  /// before this call (an addition, as KVStore<local>'s). Throws unknown_key.
  std::uint64_t version(key k) {
    auto& e = impl_->find("version", k);
    impl_->eng.wait_key(e.k.id());
    std::lock_guard lk(e.m);
    return e.pushes;
  }

  /// Writes every key's optimizer state (copied from the devices) to `path`, in the file format
  /// of KVStore<local>: a file one saves, the other loads. Waits for every op first. Throws
  /// io_error.
  void save_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    detail::save_device_states(*impl_, path);
  }

  /// Replaces every key's optimizer state with the one saved in `path` (by this store or a
  /// KVStore<local>), all or nothing, after waiting for every op. Throws as KVStore<local>'s.
  void load_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    detail::load_device_states(*impl_, path);
  }

  // ---- the cluster (one process: trivial) ----------------------------------------------------

  void barrier() {}
  int num_dead_node(int /*node_id*/, int /*timeout_sec*/ = 60) const { return 0; }
  /// Throws: unsupported (a device store has no servers).
  void send_command_to_servers(int /*head*/, std::string_view /*body*/) {
    throw error(errc::unsupported,
                "kvstore: send_command_to_servers is a dist call; a device store has no servers");
  }
  void set_barrier_before_exit(bool /*on*/) {}

 private:
  // The checks and work of the calls above (device/calls.hpp).
  using calls = detail::device_calls<T>;
  using calls::impl_;
  using calls::init_many;
  using calls::init_one;
  using calls::install;
  using calls::pull_list;
  using calls::pull_many;
  using calls::pull_rows_impl;
  using calls::push_list;
  using calls::push_many;
  using calls::push_rows_impl;
  using calls::pushpull_impl;
};

}  // namespace kvstore
