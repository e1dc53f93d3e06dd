// KVStore<dist, T> declared: the public type of a distributed job's worker, holding the worker
// (client/worker_store.hpp) by pointer. Its bodies are impl/dist.hpp; dist.hpp includes both in
// header-only builds. With KVSTORE_SEPARATE_COMPILATION the float and double stores are
// instantiated once, in <kvstore/src.hpp>, and declared extern here.
#pragma once

#include <kvstore/detail/config.hpp>
#include <kvstore/device/span.hpp>  // device_span: no Thrust, no CUDA
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/key.hpp>
#include <kvstore/op.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kvstore {

namespace detail {
template <class T>
class worker_store;  // client/worker_store.hpp
template <class T>
struct dist_device_calls;  // device/dist_calls.hpp, through device.hpp
}  // namespace detail

/// A worker of a distributed job (see the contract in API.md). Every call that blocks (init,
/// barrier, set_optimizer, saving states, commands) has a deadline from dist_options and throws
/// kvstore::error naming the node that did not answer. Push and pull return an `op` at once
/// under the same buffer rule as the local store; errors of an op (a server lost, a deadline
/// passed, a server refusing the request) are thrown by its wait().
template <class T>
class KVStore<dist, T> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "KVStore<dist, T>: T must be float or double");
  using device_calls = detail::dist_device_calls<T>;

 public:
  using value_type = T;

  /// Options from the environment (dist_options::from_env()).
  KVStore();
  /// Joins the job; throws kvstore::error when the scheduler or a server cannot be reached
  /// within connect_timeout. In a process whose role is server or scheduler this runs that role
  /// and exits the process when the job ends.
  explicit KVStore(const dist_options& o);
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;
  KVStore(KVStore&&) noexcept;
  KVStore& operator=(KVStore&&) noexcept;
  /// Waits for every op, meets the other workers at a barrier (unless set_barrier_before_exit
  /// (false)), says goodbye to servers and scheduler. Never throws.
  ~KVStore();

  std::string type() const;  ///< "dist_sync" or "dist_async"
  int rank() const noexcept;
  int num_workers() const noexcept;
  int num_servers() const noexcept;
  /// Whether this process also serves a shard of the job (dist_options::colocated): then its
  /// server's rank is rank().
  bool colocated() const noexcept;

  // ---- init: every worker calls it; rank 0's value is stored, each returns once it is -------
  void init(key k, std::span<const T> value);
  /// A matrix of value.size() / row_length rows (for push_rows / pull_rows).
  void init(key k, std::span<const T> value, std::size_t row_length);
  /// A matrix (row_length), the key's placement (partition::even: chunk i of BigDL's rule on
  /// server i) and its own wire compression.
  void init(key k, std::span<const T> value, const init_options& o);
  /// Every key checked before any is sent; one round trip for the lot. A key a server refuses is
  /// not inited, the others are, and the first error is thrown.
  void init(std::span<const key> ks, std::span<const std::span<const T>> values);

  // ---- push / pull ---------------------------------------------------------------------------
  op push(key k, std::span<const T> value, int priority = 0);
  /// Several devices' values of one key: summed here first, so one message per key leaves.
  op push(key k, std::initializer_list<std::span<const T>> values, int priority = 0);
  /// Small keys go batched, a few frames per server; a key named twice is summed.
  op push(std::span<const key> ks, std::span<const std::span<const T>> values, int priority = 0);
  op pull(key k, std::span<T> out, int priority = 0);
  /// Each output gets the value.
  op pull(key k, std::initializer_list<std::span<T>> outs, int priority = 0);
  op pull(std::span<const key> ks, std::span<const std::span<T>> outs, int priority = 0);
  /// Answered once each server's slice of `k` reached o.min_version (see version()), within
  /// request_timeout, else the op fails naming the key and the version.
  op pull(key k, std::span<T> out, pull_options o);
  /// Sync rounds completed (dist_sync) or pushes applied (dist_async), the least over the key's
  /// slices, asked after this worker's earlier ops on `k`.
  std::uint64_t version(key k);
  /// Push then pull of one key as one op: `out` gets the value after this push.
  op pushpull(key k, std::span<const T> value, std::span<T> out, int priority = 0);

  // ---- values on devices (MXNet's dist_device_sync): needs #include <kvstore/device.hpp> ----
  // Summed on the first value's device, staged through pinned memory, pushed once; a pull is
  // copied to every output's device.
  template <class D = device_calls>
  void init(key k, device_span<const T> value) {
    D::init(*impl_, std::move(k), value);
  }
  template <class D = device_calls>
  void init(std::span<const key> ks, std::span<const device_span<const T>> values) {
    D::init(*impl_, ks, values);
  }
  template <class D = device_calls>
  op push(key k, device_span<const T> value, int priority = 0) {
    return D::push(*impl_, std::move(k), std::span<const device_span<const T>>(&value, 1),
                   priority);
  }
  template <class D = device_calls>
  op push(key k, std::initializer_list<device_span<const T>> values, int priority = 0) {
    return D::push(*impl_, std::move(k),
                   std::span<const device_span<const T>>(values.begin(), values.size()), priority);
  }
  template <class D = device_calls>
  op push(key k, std::span<const device_span<const T>> values, int priority = 0) {
    return D::push(*impl_, std::move(k), values, priority);
  }
  template <class D = device_calls>
  op push(std::span<const key> ks, std::span<const device_span<const T>> values, int priority = 0) {
    return D::push(*impl_, ks, values, priority);
  }
  template <class D = device_calls>
  op pull(key k, device_span<T> out, int priority = 0) {
    return D::pull(*impl_, std::move(k), std::span<const device_span<T>>(&out, 1), priority);
  }
  template <class D = device_calls>
  op pull(key k, std::initializer_list<device_span<T>> outs, int priority = 0) {
    return D::pull(*impl_, std::move(k), std::span<const device_span<T>>(outs.begin(), outs.size()),
                   priority);
  }
  template <class D = device_calls>
  op pull(key k, std::span<const device_span<T>> outs, int priority = 0) {
    return D::pull(*impl_, std::move(k), outs, priority);
  }
  template <class D = device_calls>
  op pull(std::span<const key> ks, std::span<const device_span<T>> outs, int priority = 0) {
    return D::pull(*impl_, ks, outs, priority);
  }
  template <class D = device_calls>
  op pushpull(key k, device_span<const T> value, device_span<T> out, int priority = 0) {
    return D::pushpull(*impl_, std::move(k), value, out, priority);
  }

  // ---- rows, placement, element ranges -------------------------------------------------------
  op push_rows(key k, std::span<const std::int64_t> rows, std::span<const T> values,
               int priority = 0);
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out, int priority = 0);
  /// (start, length) of k's elements on `server`; (the key's size, 0) when it holds none.
  std::pair<std::size_t, std::size_t> slice_of(key k, int server) const;
  /// Elements [offset, offset + values.size()), sent only to the servers whose slices the range
  /// overlaps; in dist_sync it counts as this worker's push of every slice it touches.
  op push_range(key k, std::size_t offset, std::span<const T> values, int priority = 0);
  op pull_range(key k, std::size_t offset, std::span<T> out, int priority = 0);

  void wait(key k);
  void wait_all();

  // ---- compression, optimizers, states -------------------------------------------------------
  /// This worker's wire compression for every key without its own, from its next push or pull.
  void set_gradient_compression(const compression& c);
  /// Sends the optimizer (registered name and parameters, never code) to every server and
  /// returns once all have it. Not a collective. The same type with new parameters keeps every
  /// key's state; another type starts fresh. The type must be registered
  /// (KVSTORE_REGISTER_OPTIMIZER) in the servers' program too.
  template <optim::registered_optimizer O>
  void set_optimizer(const O& o) {
    send_optimizer(std::string(O::name), optim::serialize_params(o));
  }
  template <class F>
  requires(!optim::registered_optimizer<std::remove_cvref_t<F>>) void set_optimizer(F&&) {
    static_assert(optim::registered_optimizer<std::remove_cvref_t<F>>,
                  "KVStore<dist>: an optimizer travels to the servers as a registered type and its "
                  "parameters, never as code: define a type with name, num_slots, update and "
                  "serialize, and KVSTORE_REGISTER_OPTIMIZER it");
  }
  /// MXNet's lr_mult and wd_mult for `k`'s updates on the servers, from the next op on.
  void set_key_options(key k, const key_options& o);
  /// Every server's optimizer states in one file (written atomically), the local store's format.
  void save_optimizer_states(const std::filesystem::path& path);
  /// A file of save_optimizer_states (local or dist), checked whole before any server changes.
  void load_optimizer_states(const std::filesystem::path& path);

  // ---- the cluster ---------------------------------------------------------------------------
  /// All workers reach it before any leaves; throws on its deadline or a dead worker, naming it.
  void barrier();
  /// MXNet's meaning: 1 scheduler, 2 servers, 4 workers (sums combine).
  int num_dead_node(int node_id, int timeout_sec = 60);
  void send_command_to_servers(int head, std::string_view body);
  void set_barrier_before_exit(bool on);
  /// Leaves the sync group once this worker's ops are done; it may still pull, not push.
  void leave();
  bool has_left() const noexcept;
  /// Every server writes its snapshot now (dist_options::checkpoint_dir).
  void checkpoint();

 private:
  void send_optimizer(const std::string& name, const std::string& params);

  std::unique_ptr<detail::worker_store<T>> impl_;
};

}  // namespace kvstore

#ifdef KVSTORE_SEPARATE_COMPILATION
namespace kvstore {
extern template class KVStore<dist, float>;
extern template class KVStore<dist, double>;
}  // namespace kvstore
#endif
