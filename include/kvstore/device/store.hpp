// KVStore<device, T>: values on devices. Each key lives on one owner device (its value, its
// optimizer state, its updates); a push of several devices' values is one fused kernel on the
// owner that sums them and stores the sum or applies the optimizer in the same pass; a pull is a
// copy (a broadcast, for several outputs) from the owner. The engine keeps the per-key order and
// priorities of KVStore<local>; the work itself is issued on the owner's streams, and an op is
// done when the stream reaches its host callback, so no host thread waits on a device per op.
#pragma once

#include <kvstore/detail/group.hpp>
#include <kvstore/device/buffer.hpp>
#include <kvstore/device/completion.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/engine/engine.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/reduce/thrust.hpp>

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

/// One input or output buffer of a call: host memory (dev < 0) or memory of device `dev`, with
/// the stream that produced it (null: ready at the call).
template <class P>
struct dev_ref {
  P* ptr;
  std::size_t size;
  int dev;
  device_stream stream;
};

/// One key of a device store. `k`, `size`, `row_length` and `owner` never change after init; the
/// rest is touched only by the key's own tasks (one at a time, per the engine) and, under `m`, by
/// saving and loading optimizer states and by waits.
template <class T>
struct device_entry {
  device_entry(key k_, std::size_t n, std::size_t rl, int owner_)
      : k(std::move(k_)), size(n), row_length(rl), owner(owner_), value(n, owner_) {}
  ~device_entry() { rt::event_destroy(done); }

  const key k;
  const std::size_t size;
  const std::size_t row_length;
  const int owner;
  std::mutex m;
  device_buffer<T> value;
  /// Optimizer state on the owner: step count and num_slots arrays (empty until first update).
  std::uint64_t step = 0;
  std::vector<device_buffer<T>> slots;
  std::uint64_t state_gen = 0;
  device_buffer<T> scratch;  ///< partial sums of more than max_fused_inputs values
  /// The stream of the key's last op, and an event recorded there when another stream (the next
  /// op's, stream_wait's consumer) must wait for it on the device.
  rt::stream_t last_stream = nullptr;
  rt::event_t done = nullptr;
  std::shared_ptr<op_state> last_op;  ///< the op of the last part issued (wait(key) waits for it)

  std::size_t rows() const noexcept { return row_length ? size / row_length : 0; }
};

/// The store's optimizer: fused on the device for sgd/adam/adagrad, else applied on host copies.
template <class T>
struct device_optimizer {
  optim::updater<T> u;
  std::uint64_t gen = 0;
  bool fused = false;
  reduce::device_update<T> base;  ///< kind and parameters (adam's step is set per update)
  optim::adam adam{};
};

/// One device of the store: its streams (normal and high priority) and, per stream, bounded
/// staging memory for inputs its kernels cannot read directly.
struct device_ctx {
  int dev = 0;
  rt::stream_t streams[2] = {nullptr, nullptr};
  std::mutex staging_m[2];
  void* staging[2] = {nullptr, nullptr};
  std::size_t staging_bytes[2] = {0, 0};
  std::size_t bytes_owned = 0;  ///< values placed here (balanced placement)

  ~device_ctx() {
    for (int i = 0; i < 2; ++i) {
      if (staging[i]) rt::dev_free(dev, staging[i]);
      rt::stream_destroy(dev, streams[i]);
    }
  }
  /// Staging of at least `bytes` for stream i (staging_m[i] held; the stream's earlier work is
  /// finished before old memory is freed, as cudaFree waits for the device).
  void* staging_for(int i, std::size_t bytes) {
    if (staging_bytes[i] < bytes) {
      if (staging[i]) rt::dev_free(dev, staging[i]);
      staging[i] = nullptr;
      staging_bytes[i] = 0;
      staging[i] = rt::dev_malloc(dev, bytes);
      staging_bytes[i] = bytes;
    }
    return staging[i];
  }
};

template <class T>
struct device_impl {
  explicit device_impl(const device_options& o) : opts(o), eng(o.threads ? o.threads : 1) {}
  ~device_impl() {
    eng.wait_all();
    done_q.drain();
    sync_all();
    keys.clear();
  }

  device_options opts;
  std::vector<std::unique_ptr<device_ctx>> devs;  ///< in opts.devices order
  std::vector<std::vector<char>> peer;  ///< peer[i][j]: devs[i]'s kernels read devs[j]'s memory
  std::shared_mutex m;                  ///< guards `keys` (the map) and `opt`
  std::unordered_map<std::uint64_t, std::unique_ptr<device_entry<T>>> keys;
  std::shared_ptr<const device_optimizer<T>> opt;
  std::uint64_t generation = 0;
  completion_queue done_q;  ///< completes ops when their device work is done
  engine eng;               ///< last: destroyed first, its tasks use everything above

  int index_of(int dev) const noexcept {
    for (std::size_t i = 0; i < opts.devices.size(); ++i)
      if (opts.devices[i] == dev) return static_cast<int>(i);
    return -1;
  }
  device_ctx& ctx(int dev) { return *devs[static_cast<std::size_t>(index_of(dev))]; }
  /// Whether kernels on `owner` can read memory described by (dev, host?) directly.
  bool readable(int owner, int dev) const noexcept {
    // Host memory is staged on both builds: on the OMP build it could be read in place, but
    // staging it there too keeps that path tested wherever the device tests run.
    if (dev < 0) return false;
    if (!rt::is_cuda) return true;  // virtual devices over host memory
    return dev == owner ||
           peer[static_cast<std::size_t>(index_of(owner))][static_cast<std::size_t>(index_of(dev))];
  }
  void sync_all() noexcept {
    for (auto& d : devs)
      for (auto s : d->streams) try {
          rt::device_guard g(d->dev);
          rt::stream_sync(s);
        } catch (...) {
        }
  }
};

[[noreturn]] inline void device_fail(errc c, std::string_view call, const key& k,
                                     const std::string& problem) {
  throw error(c, "kvstore: " + std::string(call) + " of key " + k.str() + ": " + problem);
}

inline std::string device_list(const std::vector<int>& ds) {
  std::string s = "[";
  for (std::size_t i = 0; i < ds.size(); ++i) s += (i ? ", " : "") + std::to_string(ds[i]);
  return s + "]";
}

}  // namespace detail

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
class KVStore<device, T> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "KVStore<device, T>: T must be float or double");

 public:
  using value_type = T;

  /// A store over device 0.
  KVStore() : KVStore(device_options{}) {}
  /// A store over o.devices. Throws invalid_argument (no devices, a repeated or negative one, one
  /// that does not exist) or device_error (a stream could not be made).
  explicit KVStore(const device_options& o) : impl_(std::make_unique<detail::device_impl<T>>(o)) {
    auto& ds = impl_->opts.devices;
    if (ds.empty()) throw error(errc::invalid_argument, "kvstore: device store with no devices");
    for (std::size_t i = 0; i < ds.size(); ++i) {
      if (!detail::rt::device_exists(ds[i]))
        throw error(errc::invalid_argument,
                    "kvstore: device " + std::to_string(ds[i]) + " does not exist (" +
                        std::to_string(detail::rt::device_count()) + " visible)");
      for (std::size_t j = 0; j < i; ++j)
        if (ds[j] == ds[i])
          throw error(errc::invalid_argument,
                      "kvstore: device " + std::to_string(ds[i]) + " listed twice");
    }
    for (int d : ds) {
      auto c = std::make_unique<detail::device_ctx>();
      c->dev = d;
      const auto [greatest, least] = detail::rt::priority_range(d);
      c->streams[0] = detail::rt::stream_create(d, least);
      c->streams[1] = detail::rt::stream_create(d, greatest);
      impl_->devs.push_back(std::move(c));
    }
    impl_->peer.assign(ds.size(), std::vector<char>(ds.size(), 0));
    for (std::size_t i = 0; i < ds.size(); ++i)
      for (std::size_t j = 0; j < ds.size(); ++j) {
        if (i == j || !detail::rt::can_access_peer(ds[i], ds[j])) {
          impl_->peer[i][j] = i == j;
          continue;
        }
        detail::rt::enable_peer_access(ds[i], ds[j]);
        impl_->peer[i][j] = 1;
      }
  }
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
  int owner(key k) const { return find("owner", k).owner; }

  // ---- init ----------------------------------------------------------------------------------

  /// Stores the first value of `k` on its owner device. Returns once stored.
  /// Throws: already_inited, invalid_argument (bad device, id taken by another name).
  void init(key k, device_span<const T> value) {
    init_entries({{std::move(k), ref("init", k, value), 0}});
  }
  void init(key k, std::span<const T> value) { init_entries({{std::move(k), ref(value), 0}}); }
  /// A matrix key of value.size() / row_length rows (push_rows / pull_rows). Throws as init, and
  /// invalid_argument (row_length 0), size_mismatch (size not a multiple of row_length).
  void init(key k, device_span<const T> value, std::size_t row_length) {
    init_matrix(std::move(k), ref("init", k, value), row_length);
  }
  void init(key k, std::span<const T> value, std::size_t row_length) {
    init_matrix(std::move(k), ref(value), row_length);
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
    auto& e = find("push", k);
    return push_groups("push", {group{&e, {ref("push", k, value)}}}, priority);
  }
  op push(key k, std::span<const T> value, int priority = 0) {
    return push_groups("push", {group{&find("push", k), {ref(value)}}}, priority);
  }
  /// Pushes the sum of several values (one per device), summed in the order given.
  op push(key k, std::initializer_list<device_span<const T>> values, int priority = 0) {
    return push_list(std::move(k), values, priority);
  }
  op push(key k, std::initializer_list<std::span<const T>> values, int priority = 0) {
    return push_list(std::move(k), values, priority);
  }
  /// The sum of any number of values (a vector of device_span, say).
  op push(key k, std::span<const device_span<const T>> values, int priority = 0) {
    return push_list(std::move(k), values, priority);
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
    auto& e = find("pull", k);
    return pull_groups("pull", {ogroup{&e, {ref("pull", k, out)}}}, priority);
  }
  op pull(key k, std::span<T> out, int priority = 0) {
    return pull_groups("pull", {ogroup{&find("pull", k), {ref(out)}}}, priority);
  }
  /// Broadcasts the newest value of `k` from its owner to each of `outs`.
  op pull(key k, std::initializer_list<device_span<T>> outs, int priority = 0) {
    return pull_list(std::move(k), outs, priority);
  }
  op pull(key k, std::initializer_list<std::span<T>> outs, int priority = 0) {
    return pull_list(std::move(k), outs, priority);
  }
  op pull(key k, std::span<const device_span<T>> outs, int priority = 0) {
    return pull_list(std::move(k), outs, priority);
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
    auto& e = find("pushpull", k);
    return pushpull_impl(e, ref("pushpull", k, value), ref("pushpull", k, out), priority);
  }
  op pushpull(key k, std::span<const T> value, std::span<T> out, int priority = 0) {
    return pushpull_impl(find("pushpull", k), ref(value), ref(out), priority);
  }

  // ---- rows ----------------------------------------------------------------------------------

  /// Pushes rows of a matrix key (rows on the host; values rows.size() * row_length elements).
  /// Rows named twice are summed first; with an optimizer, they are gradients of those rows only.
  /// Throws: unknown_key, not_a_matrix, row_out_of_range, invalid_argument.
  op push_rows(key k, std::span<const std::int64_t> rows, device_span<const T> values,
               int priority = 0) {
    auto& e = find("push_rows", k);
    return push_rows_impl(e, rows, ref("push_rows", k, values), priority);
  }
  op push_rows(key k, std::span<const std::int64_t> rows, std::span<const T> values,
               int priority = 0) {
    return push_rows_impl(find("push_rows", k), rows, ref(values), priority);
  }
  /// Copies rows of a matrix key, in the order named, into `out`. Throws as push_rows.
  op pull_rows(key k, std::span<const std::int64_t> rows, device_span<T> out, int priority = 0) {
    auto& e = find("pull_rows", k);
    return pull_rows_impl(e, rows, ref("pull_rows", k, out), priority);
  }
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out, int priority = 0) {
    return pull_rows_impl(find("pull_rows", k), rows, ref(out), priority);
  }

  // ---- waiting -------------------------------------------------------------------------------

  /// Returns once every op issued on `k` before this call is done, device work included.
  void wait(key k) {
    impl_->eng.wait_key(k.id());  // every op on k issued to its stream
    detail::device_entry<T>* e = try_find(k);
    if (!e) return;
    std::shared_ptr<detail::op_state> last;
    {
      std::lock_guard lk(e->m);
      last = e->last_op;
    }
    if (!last) return;
    // The key's ops complete in order on the device, so the last one done means all are.
    std::unique_lock lk(last->m);
    last->cv.wait(lk, [&] { return last->remaining == 0; });
  }
  /// Returns once every op issued before this call is done, device work included.
  void wait_all() {
    impl_->eng.wait_all();
    impl_->done_q.drain();
    for (auto& d : impl_->devs)
      for (auto s : d->streams) {
        detail::rt::device_guard g(d->dev);
        detail::rt::stream_sync(s);
      }
  }
  /// Makes `consumer` (a stream of the caller's) wait, on the device, for every op issued on `k`
  /// before this call; the host waits only until those ops have been issued to their streams.
  void stream_wait(key k, device_stream consumer) {
    impl_->eng.wait_key(k.id());
    auto& e = find("stream_wait", k);
    std::lock_guard lk(e.m);
    if (e.last_stream)
      on_device("stream_wait", e, [&] {
        detail::rt::device_guard g(e.owner);
        detail::rt::event_record(e.done, e.last_stream);
        detail::rt::stream_wait_event(consumer, e.done);
      });
  }

  // ---- optimizers ----------------------------------------------------------------------------

  /// Sets a registered optimizer. sgd, adam and adagrad run fused into the push kernel on the
  /// owner device; any other registered type is applied on host copies of the key's value,
  /// gradient and state (correct, slow). Waits for every op in flight; states start fresh.
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

  /// Writes every key's optimizer state (copied from the devices) to `path`, in the file format
  /// of KVStore<local>: a file one saves, the other loads. Waits for every op first. Throws
  /// io_error.
  void save_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    std::map<std::uint64_t, optim::key_state<T>> states;
    std::string name;
    {
      std::shared_lock lk(impl_->m);
      const std::uint64_t gen = impl_->opt ? impl_->opt->gen : 0;
      if (impl_->opt) name = impl_->opt->u.name;
      for (auto& [id, e] : impl_->keys) {
        std::lock_guard elk(e->m);
        if (e->state_gen != gen || (e->step == 0 && e->slots.empty())) continue;
        optim::key_state<T> ks{e->k.name(), {}};
        ks.st.step = e->step;
        for (auto& s : e->slots) ks.st.slots.push_back(s.to_host());
        states.emplace(id, std::move(ks));
      }
    }
    optim::save_states<T>(path, name, states);
  }

  /// Replaces every key's optimizer state with the one saved in `path` (by this store or a
  /// KVStore<local>), all or nothing, after waiting for every op. Throws as KVStore<local>'s.
  void load_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    const auto keep = current_optimizer();
    const auto* opt = keep.get();
    auto loaded = optim::load_states<T>(path, opt ? std::string_view(opt->u.name) : "");
    std::shared_lock lk(impl_->m);
    const std::size_t nslots = opt ? static_cast<std::size_t>(opt->u.num_slots) : 0;
    std::vector<std::pair<entry*, optim::key_state<T>*>> found;
    for (auto& [id, ks] : loaded) {
      auto it = impl_->keys.find(id);
      const key shown = ks.name.empty() ? key(static_cast<std::int64_t>(id)) : key(ks.name);
      if (it == impl_->keys.end() || it->second->k.name() != ks.name)
        detail::device_fail(errc::unknown_key, "load_optimizer_states", shown,
                            "the file has a state for it, the store has no such key");
      auto& e = *it->second;
      if (!ks.st.slots.empty() &&
          (ks.st.slots.size() != nslots || ks.st.slots.front().size() != e.size))
        detail::device_fail(errc::size_mismatch, "load_optimizer_states", e.k,
                            "saved state has " + std::to_string(ks.st.slots.size()) + " slots of " +
                                std::to_string(ks.st.slots.front().size()) +
                                " elements, expected " + std::to_string(nslots) + " of " +
                                std::to_string(e.size));
      found.emplace_back(&e, &ks);
    }
    // Upload first (may fail: out of memory), then swap in, so a failure changes nothing.
    std::vector<std::vector<device_buffer<T>>> up;
    for (auto& [e, ks] : found) {
      std::vector<device_buffer<T>> s;
      for (auto& sl : ks->st.slots) s.emplace_back(std::span<const T>(sl), e->owner);
      up.push_back(std::move(s));
    }
    const std::uint64_t gen = opt ? opt->gen : 0;
    for (auto& [id, e] : impl_->keys) {
      std::lock_guard elk(e->m);
      e->slots.clear();
      e->step = 0;
      e->state_gen = gen;
    }
    for (std::size_t i = 0; i < found.size(); ++i) {
      std::lock_guard elk(found[i].first->m);
      found[i].first->step = found[i].second->st.step;
      found[i].first->slots = std::move(up[i]);
    }
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
  using entry = detail::device_entry<T>;
  using in_ref = detail::dev_ref<const T>;
  using out_ref = detail::dev_ref<T>;
  using group = detail::key_group<entry*, in_ref>;
  using ogroup = detail::key_group<entry*, out_ref>;
  struct init_item {
    key k;
    in_ref value;
    std::size_t row_length;
  };

  // ---- argument checks (at the call, before anything is queued) ------------------------------

  // A device_span, checked: the device is the store's, and its memory is on it.
  template <class P>
  detail::dev_ref<P> ref(std::string_view call, const key& k, device_span<P> s) const {
    if (impl_->index_of(s.device) < 0)
      detail::device_fail(errc::invalid_argument, call, k,
                          "device " + std::to_string(s.device) +
                              " is not one of the store's devices " +
                              detail::device_list(impl_->opts.devices));
    if (s.size && s.ptr) {
      const int where = detail::rt::pointer_device(s.ptr);
      if (where >= 0 && where != s.device)
        detail::device_fail(errc::invalid_argument, call, k,
                            "the memory given as on device " + std::to_string(s.device) +
                                " is on device " + std::to_string(where));
      if (where == detail::rt::host_memory && detail::rt::is_cuda)
        detail::device_fail(errc::invalid_argument, call, k,
                            "the memory given as on device " + std::to_string(s.device) +
                                " is host memory (pass a std::span for host memory)");
    }
    if (s.size && !s.ptr)
      detail::device_fail(errc::invalid_argument, call, k,
                          "null pointer for " + std::to_string(s.size) + " elements");
    return {s.ptr, s.size, s.device, s.stream};
  }
  template <class P>
  static detail::dev_ref<P> ref(std::span<P> s) {
    return {s.data(), s.size(), -1, nullptr};
  }

  entry* try_find(const key& k) const {
    std::shared_lock lk(impl_->m);
    auto it = impl_->keys.find(k.id());
    return it == impl_->keys.end() ? nullptr : it->second.get();
  }
  entry& find_locked(std::string_view call, const key& k) const {
    auto it = impl_->keys.find(k.id());
    if (it == impl_->keys.end()) detail::device_fail(errc::unknown_key, call, k, "never inited");
    entry& e = *it->second;
    check_same_name(call, e.k, k);
    return e;
  }
  entry& find(std::string_view call, const key& k) const {
    std::shared_lock lk(impl_->m);
    return find_locked(call, k);
  }
  static void check_same_name(std::string_view call, const key& have, const key& k) {
    if (have.is_named() != k.is_named() || have.name() != k.name())
      detail::device_fail(
          errc::invalid_argument, call, k,
          "its id " + std::to_string(k.id()) + " is already taken by key " + have.str());
  }
  static void check_size(std::string_view call, const entry& e, std::size_t n) {
    if (n != e.size)
      detail::device_fail(
          errc::size_mismatch, call, e.k,
          "size " + std::to_string(n) + " does not match the key's size " + std::to_string(e.size));
  }
  static void check_rows(std::string_view call, const entry& e, std::span<const std::int64_t> rows,
                         std::size_t n) {
    if (e.row_length == 0)
      detail::device_fail(errc::not_a_matrix, call, e.k,
                          "it was inited without a row length, so it has no rows");
    const auto nrows = static_cast<std::int64_t>(e.rows());
    for (std::int64_t r : rows)
      if (r < 0 || r >= nrows)
        detail::device_fail(errc::row_out_of_range, call, e.k,
                            "row " + std::to_string(r) + " is out of range (the key has " +
                                std::to_string(nrows) + " rows)");
    if (n != rows.size() * e.row_length)
      detail::device_fail(errc::invalid_argument, call, e.k,
                          std::to_string(rows.size()) + " rows of " + std::to_string(e.row_length) +
                              " need " + std::to_string(rows.size() * e.row_length) +
                              " elements, given " + std::to_string(n));
  }

  std::shared_ptr<const detail::device_optimizer<T>> current_optimizer() const {
    std::shared_lock lk(impl_->m);
    return impl_->opt;
  }

  // Runs f; a kvstore::error from it comes back naming the call, the key and the owner device.
  template <class F>
  static void on_device(std::string_view call, const entry& e, F&& f) {
    try {
      f();
    } catch (const error& x) {
      throw error(static_cast<errc>(x.code().value()),
                  "kvstore: " + std::string(call) + " of key " + e.k.str() + " on device " +
                      std::to_string(e.owner) + ": " + x.what());
    }
  }

  // ---- init ----------------------------------------------------------------------------------

  void init_matrix(key k, in_ref v, std::size_t row_length) {
    if (row_length == 0) detail::device_fail(errc::invalid_argument, "init", k, "row_length is 0");
    if (v.size % row_length != 0)
      detail::device_fail(errc::size_mismatch, "init", k,
                          "size " + std::to_string(v.size) +
                              " is not a multiple of the row length " + std::to_string(row_length));
    init_entries({{std::move(k), v, row_length}});
  }

  template <class S>
  void init_many(std::span<const key> ks, std::span<const S> values) {
    if (ks.size() != values.size())
      throw error(errc::invalid_argument, "kvstore: init of " + std::to_string(ks.size()) +
                                              " keys with " + std::to_string(values.size()) +
                                              " values");
    std::vector<init_item> items;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      if constexpr (is_device_span_v<S>)
        items.push_back({ks[i], ref("init", ks[i], values[i]), 0});
      else
        items.push_back({ks[i], ref(values[i]), 0});
    }
    init_entries(std::move(items));
  }

  // Checks all, places all, copies all; inserts only when everything succeeded. Holds the store's
  // lock throughout (init is rare and must not race the placement counts).
  void init_entries(std::vector<init_item> items) {
    std::unique_lock lk(impl_->m);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const key& k = items[i].k;
      bool twice = false;
      auto hit = impl_->keys.find(k.id());
      if (hit != impl_->keys.end()) {
        check_same_name("init", hit->second->k, k);
        twice = true;
      }
      for (std::size_t j = 0; j < i && !twice; ++j)
        if (items[j].k.id() == k.id()) {
          check_same_name("init", items[j].k, k);
          twice = true;
        }
      if (twice) detail::device_fail(errc::already_inited, "init", k, "inited twice");
    }
    std::vector<std::size_t> added(impl_->devs.size(), 0);
    std::vector<std::unique_ptr<entry>> made;
    for (auto& it : items) {
      std::size_t at = 0;
      if (impl_->opts.placement == placement::balanced)
        for (std::size_t d = 1; d < impl_->devs.size(); ++d)
          if (impl_->devs[d]->bytes_owned + added[d] < impl_->devs[at]->bytes_owned + added[at])
            at = d;
      added[at] += it.value.size * sizeof(T);
      const int owner = impl_->devs[at]->dev;
      std::unique_ptr<entry> e;
      try {
        e = std::make_unique<entry>(it.k, it.value.size, it.row_length, owner);
        e->done = detail::rt::event_create(owner);
        detail::rt::device_guard g(owner);
        auto s = impl_->devs[at]->streams[0];
        detail::rt::copy_async(e->value.data(), it.value.ptr, it.value.size * sizeof(T), s);
        detail::rt::stream_sync(s);
      } catch (const error& x) {
        detail::device_fail(static_cast<errc>(x.code().value()), "init", it.k,
                            "on device " + std::to_string(owner) + ": " + x.what());
      }
      made.push_back(std::move(e));
    }
    for (std::size_t d = 0; d < impl_->devs.size(); ++d) impl_->devs[d]->bytes_owned += added[d];
    for (auto& e : made) {
      const std::uint64_t id = e->k.id();
      impl_->keys.emplace(id, std::move(e));
    }
  }

  // ---- issuing work --------------------------------------------------------------------------

  // Queues one part of `st` on e's key: `work(stream)` issues the device work (e.m held), then the
  // part completes when the stream gets there. Errors while issuing fail the part.
  template <class W>
  void submit(entry& e, int priority, const std::shared_ptr<detail::op_state>& st,
              std::string_view call, bool may_inline, W work) {
    detail::device_impl<T>* impl = impl_.get();
    impl->eng.submit(
        e.k.id(), priority,
        [impl, ep = &e, st, call, priority,
         work = std::move(work)](const detail::engine::done_fn& done) {
          try {
            std::lock_guard lk(ep->m);
            on_device(call, *ep, [&] {
              auto& c = impl->ctx(ep->owner);
              const int si = priority > 0 ? 1 : 0;
              detail::rt::stream_t s = c.streams[si];
              detail::rt::device_guard g(ep->owner);
              // The key's previous op ran on the other stream: wait for it on the device. The
              // event is recorded now, so it may also cover later work of other keys there.
              if (ep->last_stream && ep->last_stream != s) {
                detail::rt::event_record(ep->done, ep->last_stream);
                detail::rt::stream_wait_event(s, ep->done);
              }
              work(c, si, s);
              ep->last_stream = s;
              ep->last_op = st;
              impl->done_q.add(ep->owner, s, st);
            });
          } catch (...) {
            st->complete_part(std::current_exception());
          }
          done(nullptr);
        },
        nullptr, may_inline);
  }

  bool may_inline(const entry& e, const detail::device_optimizer<T>* opt) const noexcept {
    return e.size < (std::size_t{1} << 16) && (!opt || opt->fused);
  }

  // Makes s wait for the producers of the inputs.
  static void wait_producers(detail::rt::stream_t s, std::span<const in_ref> in) {
    for (auto& r : in)
      if (r.stream && r.stream != s) detail::rt::stream_wait_stream(r.dev, s, r.stream);
  }

  // The update a push applies: store, fused optimizer (its state made ready, step advanced), or
  // null for an optimizer applied on the host.
  static bool prepare_update(entry& e, const detail::device_optimizer<T>* opt,
                             detail::rt::stream_t s, reduce::device_update<T>& u, T*& s0, T*& s1) {
    s0 = s1 = nullptr;
    if (!opt) return true;
    ensure_state(e, *opt, s);
    if (!opt->fused) return false;
    ++e.step;
    u = opt->base;
    if (u.kind == reduce::device_update<T>::adam) u.adam_st = opt->adam.template step_at<T>(e.step);
    const int used = u.slots();
    if (used > 0) s0 = e.slots[0].data();
    if (used > 1) s1 = e.slots[1].data();
    return true;
  }
  static void ensure_state(entry& e, const detail::device_optimizer<T>& o, detail::rt::stream_t s) {
    if (e.state_gen != o.gen) {
      e.slots.clear();
      e.step = 0;
      e.state_gen = o.gen;
    }
    if (e.slots.size() != static_cast<std::size_t>(o.u.num_slots)) {
      e.slots.clear();
      for (int i = 0; i < o.u.num_slots; ++i) {
        e.slots.emplace_back(e.size, e.owner);
        detail::rt::memset_async(e.slots.back().data(), e.size * sizeof(T), s);
      }
    }
  }

  // Issues the sum of `in` into e (stored or applied), on stream s of device context c.
  static void issue_push(detail::device_impl<T>& impl, entry& e, detail::device_ctx& c, int si,
                         detail::rt::stream_t s, std::span<const in_ref> in,
                         const detail::device_optimizer<T>* opt) {
    wait_producers(s, in);
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
            detail::rt::copy_async(dst, in[j].ptr + b, n * sizeof(T), s);
            p[j] = dst;
          }
        }
        reduce::fused_sum_update<T>(s, p.data(), k, target + b, s0 ? s0 + b : nullptr,
                                    s1 ? s1 + b : nullptr, partial + b, n, upd);
      }
    }
    if (!on_device_update) host_update(e, *opt, s);
  }

  // An optimizer that has no device kernel: gradient (in scratch), weight and state copied to the
  // host, updated there, copied back. Waits for the stream (this key's task only).
  static void host_update(entry& e, const detail::device_optimizer<T>& o, detail::rt::stream_t s) {
    std::vector<T> g(e.size), w(e.size);
    optim::state<T> st;
    st.step = e.step;
    st.slots.resize(e.slots.size(), std::vector<T>(e.size));
    detail::rt::copy_async(g.data(), e.scratch.data(), e.size * sizeof(T), s);
    detail::rt::copy_async(w.data(), e.value.data(), e.size * sizeof(T), s);
    for (std::size_t i = 0; i < e.slots.size(); ++i)
      detail::rt::copy_async(st.slots[i].data(), e.slots[i].data(), e.size * sizeof(T), s);
    detail::rt::stream_sync(s);
    o.u.apply(e.k, std::span<const T>(g), std::span<T>(w), st);
    e.step = st.step;
    detail::rt::copy_async(e.value.data(), w.data(), e.size * sizeof(T), s);
    for (std::size_t i = 0; i < e.slots.size(); ++i)
      detail::rt::copy_async(e.slots[i].data(), st.slots[i].data(), e.size * sizeof(T), s);
    detail::rt::stream_sync(s);  // the host vectors go out of scope
  }

  // Broadcast from the owner: one copy per output. An output the owner's kernels can write (its
  // own memory, a peer's) is written by a copy kernel, which costs less to launch than a
  // device-to-device cudaMemcpyAsync; host memory gets a plain copy.
  static void issue_pull(detail::device_impl<T>& impl, entry& e, detail::rt::stream_t s,
                         std::span<const out_ref> outs) {
    for (auto& o : outs) {
      if (impl.readable(e.owner, o.dev)) {
        const T* src = e.value.data();
        reduce::fused_sum_update<T>(s, &src, 1, o.ptr, nullptr, nullptr, o.ptr, e.size,
                                    reduce::device_update<T>{});
      } else {
        detail::rt::copy_async(o.ptr, e.value.data(), e.size * sizeof(T), s);
      }
    }
  }

  template <class L>
  op push_list(key k, const L& values, int priority) {
    if (std::size(values) == 0) detail::device_fail(errc::invalid_argument, "push", k, "no values");
    auto& e = find("push", k);
    std::vector<in_ref> refs;
    for (const auto& v : values) {
      if constexpr (is_device_span_v<std::remove_cvref_t<decltype(v)>>)
        refs.push_back(ref("push", k, v));
      else
        refs.push_back(ref(v));
    }
    return push_groups("push", {group{&e, std::move(refs)}}, priority);
  }
  template <class L>
  op pull_list(key k, const L& outs, int priority) {
    if (std::size(outs) == 0) detail::device_fail(errc::invalid_argument, "pull", k, "no outputs");
    auto& e = find("pull", k);
    std::vector<out_ref> refs;
    for (const auto& v : outs) {
      if constexpr (is_device_span_v<std::remove_cvref_t<decltype(v)>>)
        refs.push_back(ref("pull", k, v));
      else
        refs.push_back(ref(v));
    }
    return pull_groups("pull", {ogroup{&e, std::move(refs)}}, priority);
  }

  template <class S>
  op push_many(std::span<const key> ks, std::span<const S> values, int priority) {
    if (ks.size() != values.size())
      throw error(errc::invalid_argument, "kvstore: push of " + std::to_string(ks.size()) +
                                              " keys with " + std::to_string(values.size()) +
                                              " values");
    std::vector<in_ref> refs;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if constexpr (is_device_span_v<S>)
        refs.push_back(ref("push", ks[i], values[i]));
      else
        refs.push_back(ref(values[i]));
    }
    std::vector<group> groups;
    {
      std::shared_lock lk(impl_->m);
      groups = detail::group_by_key<entry*>(
          std::span<const in_ref>(refs), [&](std::size_t i) { return &find_locked("push", ks[i]); },
          std::equal_to<>{});
    }
    return push_groups("push", std::move(groups), priority);
  }
  template <class S>
  op pull_many(std::span<const key> ks, std::span<const S> outs, int priority) {
    if (ks.size() != outs.size())
      throw error(errc::invalid_argument, "kvstore: pull of " + std::to_string(ks.size()) +
                                              " keys into " + std::to_string(outs.size()) +
                                              " outputs");
    std::vector<out_ref> refs;
    for (std::size_t i = 0; i < outs.size(); ++i) {
      if constexpr (is_device_span_v<S>)
        refs.push_back(ref("pull", ks[i], outs[i]));
      else
        refs.push_back(ref(outs[i]));
    }
    std::vector<ogroup> groups;
    {
      std::shared_lock lk(impl_->m);
      groups = detail::group_by_key<entry*>(
          std::span<const out_ref>(refs),
          [&](std::size_t i) { return &find_locked("pull", ks[i]); }, std::equal_to<>{});
    }
    return pull_groups("pull", std::move(groups), priority);
  }

  op push_groups(std::string_view call, std::vector<group> groups, int priority) {
    for (auto& g : groups)
      for (auto& s : g.bufs) check_size(call, *g.h, s.size);
    if (groups.empty()) return op::done();
    auto opt = current_optimizer();
    auto st = std::make_shared<detail::op_state>(groups.size());
    for (auto& g : groups) {
      entry& e = *g.h;
      submit(e, priority, st, call, may_inline(e, opt.get()),
             [impl = impl_.get(), ep = &e, in = std::move(g.bufs), opt](
                 detail::device_ctx& c, int si, detail::rt::stream_t s) {
               issue_push(*impl, *ep, c, si, s, in, opt.get());
             });
    }
    return op(std::move(st));
  }

  op pull_groups(std::string_view call, std::vector<ogroup> groups, int priority) {
    for (auto& g : groups)
      for (auto& o : g.bufs) check_size(call, *g.h, o.size);
    if (groups.empty()) return op::done();
    auto st = std::make_shared<detail::op_state>(groups.size());
    for (auto& g : groups) {
      entry& e = *g.h;
      submit(e, priority, st, call, may_inline(e, nullptr),
             [impl = impl_.get(), ep = &e, outs = std::move(g.bufs)](detail::device_ctx&, int,
                                                                     detail::rt::stream_t s) {
               issue_pull(*impl, *ep, s, outs);
             });
    }
    return op(std::move(st));
  }

  op pushpull_impl(entry& e, in_ref value, out_ref out, int priority) {
    check_size("pushpull", e, value.size);
    check_size("pushpull", e, out.size);
    auto opt = current_optimizer();
    auto st = std::make_shared<detail::op_state>(1);
    submit(e, priority, st, "pushpull", may_inline(e, opt.get()),
           [impl = impl_.get(), ep = &e, value, out, opt](detail::device_ctx& c, int si,
                                                          detail::rt::stream_t s) {
             issue_push(*impl, *ep, c, si, s, std::span<const in_ref>(&value, 1), opt.get());
             issue_pull(*impl, *ep, s, std::span<const out_ref>(&out, 1));
           });
    return op(std::move(st));
  }

  op push_rows_impl(entry& e, std::span<const std::int64_t> rows, in_ref values, int priority) {
    check_rows("push_rows", e, rows, values.size);
    auto opt = current_optimizer();
    auto st = std::make_shared<detail::op_state>(1);
    submit(e, priority, st, "push_rows", may_inline(e, opt.get()),
           [impl = impl_.get(), ep = &e, rows, values, opt](detail::device_ctx&, int,
                                                            detail::rt::stream_t s) {
             issue_push_rows(*impl, *ep, s, rows, values, opt.get());
           });
    return op(std::move(st));
  }

  // Rows in ascending order, a row named several times summed in the order given (as local).
  static void issue_push_rows(detail::device_impl<T>& impl, entry& e, detail::rt::stream_t s,
                              std::span<const std::int64_t> rows, in_ref values,
                              const detail::device_optimizer<T>* opt) {
    wait_producers(s, std::span<const in_ref>(&values, 1));
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
    auto* tmp = static_cast<char*>(detail::rt::dev_malloc_async(ib + ob + xb, s));
    detail::rt::copy_async(tmp, urow.data(), ib, s);
    detail::rt::copy_async(tmp + ib, off.data(), ob, s);
    detail::rt::copy_async(tmp + ib + ob, order.data(), xb, s);
    const T* vals = values.ptr;
    T* vtmp = nullptr;
    if (!impl.readable(e.owner, values.dev)) {
      vtmp = static_cast<T*>(detail::rt::dev_malloc_async(values.size * sizeof(T), s));
      detail::rt::copy_async(vtmp, values.ptr, values.size * sizeof(T), s);
      vals = vtmp;
    }
    reduce::rows_update<T>(s, vals, reinterpret_cast<const std::int64_t*>(tmp),
                           reinterpret_cast<const std::uint64_t*>(tmp + ib),
                           reinterpret_cast<const std::uint64_t*>(tmp + ib + ob), urow.size(), rl,
                           e.value.data(), s0, s1, u);
    detail::rt::dev_free_async(vtmp, s);
    detail::rt::dev_free_async(tmp, s);
    // The host index vectors die here: a pageable-memory copy has taken them by the time
    // cudaMemcpyAsync returns, so this is safe.
  }

  static void host_rows_update(entry& e, const detail::device_optimizer<T>& o,
                               detail::rt::stream_t s, const std::vector<std::int64_t>& urow,
                               const std::vector<std::uint64_t>& off,
                               const std::vector<std::uint64_t>& order, in_ref values) {
    const std::size_t rl = e.row_length;
    ensure_state(e, o, s);
    std::vector<T> w(e.size), v(values.size);
    std::vector<std::vector<T>> sl(e.slots.size(), std::vector<T>(e.size));
    detail::rt::copy_async(w.data(), e.value.data(), e.size * sizeof(T), s);
    detail::rt::copy_async(v.data(), values.ptr, values.size * sizeof(T), s);
    for (std::size_t i = 0; i < sl.size(); ++i)
      detail::rt::copy_async(sl[i].data(), e.slots[i].data(), e.size * sizeof(T), s);
    detail::rt::stream_sync(s);
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
             optim::updater<T>::view(st, at, rl));
    }
    detail::rt::copy_async(e.value.data(), w.data(), e.size * sizeof(T), s);
    for (std::size_t i = 0; i < st.slots.size(); ++i)
      detail::rt::copy_async(e.slots[i].data(), st.slots[i].data(), e.size * sizeof(T), s);
    detail::rt::stream_sync(s);
  }

  op pull_rows_impl(entry& e, std::span<const std::int64_t> rows, out_ref out, int priority) {
    check_rows("pull_rows", e, rows, out.size);
    auto st = std::make_shared<detail::op_state>(1);
    submit(
        e, priority, st, "pull_rows", may_inline(e, nullptr),
        [impl = impl_.get(), ep = &e, rows, out](detail::device_ctx&, int, detail::rt::stream_t s) {
          if (rows.empty()) return;
          const std::size_t ib = rows.size() * sizeof(std::int64_t);
          auto* idx = static_cast<std::int64_t*>(detail::rt::dev_malloc_async(ib, s));
          detail::rt::copy_async(idx, rows.data(), ib, s);
          const bool direct = impl->readable(ep->owner, out.dev);
          T* dst = direct ? out.ptr
                          : static_cast<T*>(detail::rt::dev_malloc_async(out.size * sizeof(T), s));
          reduce::gather_rows<T>(s, ep->value.data(), idx, rows.size(), ep->row_length, dst);
          if (!direct) {
            detail::rt::copy_async(out.ptr, dst, out.size * sizeof(T), s);
            detail::rt::dev_free_async(dst, s);
          }
          detail::rt::dev_free_async(idx, s);
        });
    return op(std::move(st));
  }

  void install(optim::updater<T> u) {
    wait_all();
    auto o = std::make_shared<detail::device_optimizer<T>>();
    using U = reduce::device_update<T>;
    if (u.name == optim::sgd::name) {
      const auto p = detail::deserialize_params<optim::sgd>(u.name, u.params);
      o->fused = true;
      o->base.kind = U::sgd;
      o->base.sgd_st = p.template step<T>();
    } else if (u.name == optim::adam::name) {
      o->fused = true;
      o->adam = detail::deserialize_params<optim::adam>(u.name, u.params);
      o->base.kind = U::adam;
    } else if (u.name == optim::adagrad::name) {
      const auto p = detail::deserialize_params<optim::adagrad>(u.name, u.params);
      o->fused = true;
      o->base.kind = U::adagrad;
      o->base.adagrad_st = p.template step<T>();
    }
    o->u = std::move(u);
    std::unique_lock lk(impl_->m);
    o->gen = ++impl_->generation;
    impl_->opt = std::move(o);
  }

  std::unique_ptr<detail::device_impl<T>> impl_;
};

}  // namespace kvstore
