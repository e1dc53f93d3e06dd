// MXNet's KVStore as clojure-mxnet's kvstore namespace lists it: a store made by name at run time
// (create("local" | "device" | "dist" | "dist_sync" | "dist_async")) with the calls of that list,
// one for one, and MXNet's meanings. A thin layer: every call is a call of the store underneath
// (KVStore<local>, KVStore<device> or KVStore<dist>), through compat/mxnet/erased_store.hpp.
//
//   auto kv = kvstore::compat::mxnet::KVStore::create("local");    // mx.kv.create('local')
//   kv.init(3, ones);                                               // kv.init(3,
//   mx.nd.ones(shape)) kv.push(3, {g0, g1, g2, g3});                                   //
//   kv.push(3, [g0, g1, g2, g3]) kv.pull(3, out).wait();                                         //
//   kv.pull(3, out=a)
//
// This header needs neither Thrust nor CUDA. "device" is there when <kvstore/device.hpp> was
// included before this header in some file of the program (that file then builds the device store
// and registers it); otherwise create("device") throws kvstore::error(unsupported) saying so.
#pragma once

#include <kvstore/compat/mxnet/erased_store.hpp>
#include <kvstore/compat/mxnet/store_name.hpp>
#include <kvstore/error.hpp>
#include <kvstore/kvstore.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::compat::mxnet {

namespace detail {
/// Builds the "device" store; set (before main) by the device section at the end of this header
/// when <kvstore/device.hpp> came first, so a program without Thrust never names KVStore<device>.
using device_store_factory = std::unique_ptr<erased_store> (*)();
inline device_store_factory& device_factory() noexcept {
  static device_store_factory f = nullptr;
  return f;
}

/// A key as inited through the layer: row_sparse_pull needs its row length to place rows.
struct key_shape {
  std::size_t size = 0;
  std::size_t row_length = 0;  ///< 0: a dense key (no rows)
};
}  // namespace detail

/// MXNet's KVStore, type-erased over the local, device and dist stores and chosen by name at run
/// time. Values are float, as NDArrays' default. Movable, not copyable. Calls may come from
/// several threads at once, as on the stores, except dispose(), which must not race other calls.
/// Every call after dispose() (or on a moved-from store) throws kvstore::error(shutdown) naming
/// the call; dispose() itself then does nothing.
class KVStore {
 public:
  /// MXNet's kvstore types, in the order error messages list them.
  static constexpr const auto& type_names = detail::type_names;

  /// Makes a store by MXNet's name, read as MXNet's KVStore::Create does
  /// (compat/mxnet/store_name.hpp): "dist", "dist_sync", "dist_device_sync" (a dist_sync
  /// worker), "dist_async"; "device", "local_allreduce_device" (KVStore<device> over every
  /// visible GPU; the OMP build: one virtual device); "local", "local_allreduce_cpu". The dist
  /// store's other options come from the environment (dist_options::from_env()); its servers
  /// keep their own mode (KVSTORE_TYPE where they start, or this program's name in an SPMD
  /// launch): a KVSTORE_TYPE that contradicts the name is an error rather than a silent mix. In a
  /// process whose role is server or scheduler, a dist name runs that role and exits, as MXNet
  /// does. Throws kvstore::error: invalid_argument (a name with none of local, device, dist; a
  /// contradicting KVSTORE_TYPE; a malformed environment), unsupported (a device name in a
  /// program built without <kvstore/device.hpp>), and what the store's constructor throws.
  static KVStore create(std::string_view name = "local") {
    const auto n = detail::read_store_name(name);
    using store = detail::store_name::store;
    if (n.kind == store::dist) {
      auto o = dist_options::from_env();
      check_env_type(n.type, n.sync);
      o.sync = n.sync;
      return KVStore(n.type,
                     std::make_unique<detail::store_model<kvstore::KVStore<dist, float>>>(o));
    }
    if (n.kind == store::device) {
      if (!detail::device_factory())
        throw error(errc::unsupported,
                    "kvstore: mxnet::KVStore::create(\"" + std::string(name) +
                        "\"): this program was built without the device store; #include "
                        "<kvstore/device.hpp> (Thrust, with CUDA or the OMP backend) before "
                        "<kvstore/compat/mxnet.hpp>");
      return KVStore(n.type, detail::device_factory()());
    }
    return KVStore(n.type, std::make_unique<detail::store_model<kvstore::KVStore<local, float>>>());
  }

  KVStore(KVStore&&) noexcept = default;
  KVStore& operator=(KVStore&&) noexcept = default;
  /// As dispose().
  ~KVStore() = default;

  /// The name given to create, in lower case as MXNet's type is ("dist" stays "dist").
  std::string type() const { return live("type").name; }

  /// Releases the store: waits for its ops, and a dist worker leaves the job (meeting the others
  /// at a barrier first unless set_barrier_before_exit(false)). Later calls throw; a second
  /// dispose() does nothing.
  void dispose() noexcept { s_.reset(); }

  /// 0 .. num_workers() - 1; 0 for local and device.
  int rank() const { return live("rank").store->rank(); }
  /// 1 for local and device.
  int num_workers() const { return live("num_workers").store->num_workers(); }

  // ---- init ----------------------------------------------------------------------------------

  /// Inits several keys (only rank 0's values are stored; every worker calls it and returns once
  /// they are). Throws what the store's init throws (already_inited, invalid_argument, ...).
  void init(std::span<const key> ks, std::span<const std::span<const float>> values) {
    auto& s = live("init");
    s.store->init(ks, values);
    std::lock_guard lk(s.m);
    for (std::size_t i = 0; i < ks.size(); ++i) s.shapes[ks[i].id()] = {values[i].size(), 0};
  }

  /// Inits one key; with row_length > 0 it is a row_sparse key of value.size() / row_length
  /// rows (for row_sparse_pull). Throws as init above, and size_mismatch (value.size() not a
  /// multiple of row_length).
  void init(key k, std::span<const float> value, std::size_t row_length = 0) {
    auto& s = live("init");
    if (row_length)
      s.store->init_rows(k, value, row_length);
    else
      s.store->init(std::span<const key>(&k, 1),
                    std::span<const std::span<const float>>(&value, 1));
    std::lock_guard lk(s.m);
    s.shapes[k.id()] = {value.size(), row_length};
  }

  // ---- push and pull -------------------------------------------------------------------------

  /// Pushes several keys as one op; a key listed several times gets the sum of its values (the
  /// values of several devices). With an optimizer set, the sum is a gradient. Returns at once:
  /// keep the values alive and unchanged until the op is done. Throws unknown_key,
  /// size_mismatch, invalid_argument (ks and values differ in length).
  op push(std::span<const key> ks, std::span<const std::span<const float>> values,
          int priority = 0) {
    return live("push").store->push(ks, values, priority);
  }
  /// One key's value (MXNet's push of a single NDArray).
  op push(key k, std::span<const float> value, int priority = 0) {
    return push(std::span<const key>(&k, 1), std::span<const std::span<const float>>(&value, 1),
                priority);
  }
  /// The values of several devices for one key, summed (MXNet's push of a list of NDArrays).
  op push(key k, std::initializer_list<std::span<const float>> values, int priority = 0) {
    const std::vector<key> ks(values.size(), k);
    return push(std::span<const key>(ks), std::span<const std::span<const float>>(values),
                priority);
  }

  /// Pulls several keys as one op; a key listed several times fills each of its outputs.
  /// Returns at once: read the outputs once the op is done. Throws as push.
  op pull(std::span<const key> ks, std::span<const std::span<float>> outs, int priority = 0) {
    return live("pull").store->pull(ks, outs, priority);
  }
  /// One key into one output (MXNet's pull(key, out=a)).
  op pull(key k, std::span<float> out, int priority = 0) {
    return pull(std::span<const key>(&k, 1), std::span<const std::span<float>>(&out, 1), priority);
  }
  /// One key into the outputs of several devices (MXNet's pull(key, out=[a, b, ...])).
  op pull(key k, std::initializer_list<std::span<float>> outs, int priority = 0) {
    const std::vector<key> ks(outs.size(), k);
    return pull(std::span<const key>(ks), std::span<const std::span<float>>(outs), priority);
  }

  /// MXNet's row_sparse_pull of a row_sparse key (inited with a row_length): `out` has the key's
  /// full shape; the rows named (in any order, repeats allowed: they are deduplicated) get the
  /// stored rows, every other row of `out` is zero. Returns at once, as pull. Throws
  /// unknown_key, not_a_matrix (a key inited without a row_length), size_mismatch (out is not
  /// the key's size), row_out_of_range.
  op row_sparse_pull(key k, std::span<float> out, std::span<const std::int64_t> rows,
                     int priority = 0) {
    auto& s = live("row_sparse_pull");
    const detail::key_shape shape = shape_of(s, k);
    if (out.size() != shape.size)
      fail(errc::size_mismatch, k,
           "out has " + std::to_string(out.size()) + " elements, the key's full shape " +
               std::to_string(shape.size));
    const std::size_t row_length = shape.row_length;
    auto unique_rows = std::make_shared<std::vector<std::int64_t>>(rows.begin(), rows.end());
    std::sort(unique_rows->begin(), unique_rows->end());
    unique_rows->erase(std::unique(unique_rows->begin(), unique_rows->end()), unique_rows->end());
    const auto num_rows = static_cast<std::int64_t>(shape.size / row_length);
    for (std::int64_t r : *unique_rows)
      if (r < 0 || r >= num_rows)
        fail(errc::row_out_of_range, k,
             "row " + std::to_string(r) + " is out of range (the key has " +
                 std::to_string(num_rows) + " rows)");
    if (unique_rows->empty()) {  // no rows asked: all zeros, nothing to fetch
      std::fill(out.begin(), out.end(), 0.0f);
      return op::done();
    }
    // The store fetches the rows into a compact buffer; once they are there, they are placed
    // into the full shape and every other row is zeroed.
    auto fetched = std::make_shared<std::vector<float>>(unique_rows->size() * row_length);
    return s.store->pull_rows(k, *unique_rows, *fetched, priority)
        .then([unique_rows, fetched, out, row_length](std::exception_ptr e) {
          if (e) return;
          std::fill(out.begin(), out.end(), 0.0f);
          for (std::size_t i = 0; i < unique_rows->size(); ++i)
            std::copy_n(fetched->data() + i * row_length, row_length,
                        out.data() + static_cast<std::size_t>((*unique_rows)[i]) * row_length);
        });
  }

  /// As above with the rows written in place: kv.row_sparse_pull(k, out, {0, 2}).
  op row_sparse_pull(key k, std::span<float> out, std::initializer_list<std::int64_t> rows,
                     int priority = 0) {
    return row_sparse_pull(std::move(k), out, std::span<const std::int64_t>(rows), priority);
  }

  // ---- optimizer -----------------------------------------------------------------------------

  /// Registers an optimizer (optim::sgd, adam, adagrad, add, or a type registered with
  /// KVSTORE_REGISTER_OPTIMIZER); later pushes are gradients. On dist it goes to every server as
  /// its registered name and parameters and returns once all have it; one worker alone may call
  /// it (MXNet's scripts call it from rank 0). The same type again keeps the keys' state.
  template <optim::registered_optimizer O>
  void set_optimizer(const O& o) {
    live("set_optimizer")
        .store->set_optimizer(optim::make_updater<float>(o),
                              [&o](erased_store_dist& d) { d.set_optimizer(o); });
  }
  template <class F>
  requires(!optim::registered_optimizer<F>) void set_optimizer(const F&) {
    static_assert(optim::registered_optimizer<F>,
                  "mxnet::KVStore::set_optimizer takes a registered optimizer type (optim::sgd, "
                  "optim::adam, ... or one registered with KVSTORE_REGISTER_OPTIMIZER): a store "
                  "made by name may be dist, where optimizers travel as type and parameters");
  }

  /// Writes the optimizer state of every key to `path` (the stores' one file format). Throws
  /// io_error.
  void save_optimizer_states(const std::filesystem::path& path) {
    live("save_optimizer_states").store->save_optimizer_states(path);
  }
  /// Loads states saved by save_optimizer_states (from any store). Throws io_error, bad_file
  /// (another optimizer, a corrupt file), unknown_key, size_mismatch; then nothing changed.
  void load_optimizer_states(const std::filesystem::path& path) {
    live("load_optimizer_states").store->load_optimizer_states(path);
  }

  // ---- the cluster ---------------------------------------------------------------------------

  /// Every worker reaches it before any leaves (local and device: returns at once).
  void barrier() { live("barrier").store->barrier(); }
  /// Runs the servers' command hook on every server; returns once all ran. On local and device
  /// (no servers) it does nothing, as MXNet's.
  void send_command_to_servers(int head, std::string_view body) {
    live("send_command_to_servers").store->send_command_to_servers(head, body);
  }
  /// How many nodes of the groups in node_id (1 scheduler, 2 servers, 4 workers; sums combine)
  /// were not heard from for timeout_sec (local and device: 0).
  int num_dead_node(int node_id, int timeout_sec = 60) {
    return live("num_dead_node").store->num_dead_node(node_id, timeout_sec);
  }
  /// Whether disposing meets the other workers at a barrier first (dist; default true).
  void set_barrier_before_exit(bool barrier_before_exit) {
    live("set_barrier_before_exit").store->set_barrier_before_exit(barrier_before_exit);
  }

  // ---- compression ---------------------------------------------------------------------------

  /// MXNet's set_gradient_compression: this worker's wire compression for every key from its
  /// next push or pull on (the store's set_gradient_compression: two_bit with its threshold,
  /// fp16, bf16, bf16_trunc; servers keep full precision). As MXNet, only device and dist stores
  /// compress. Throws kvstore::error: unsupported (a local store, as MXNet's "not supported for
  /// this type of kvstore"), invalid_argument (a type out of range, a two_bit threshold that is
  /// not finite and > 0); then nothing changed.
  void set_gradient_compression(const compression& c) {
    auto& s = live("set_gradient_compression");
    if (s.name == "local")
      throw error(errc::unsupported,
                  "kvstore: mxnet::KVStore::set_gradient_compression: gradient compression is not "
                  "supported for a local kvstore (as in MXNet: values do not travel); use device "
                  "or dist");
    s.store->set_gradient_compression(c);
  }

  /// MXNet's own form, its compression_params as MXKVStoreSetGradientCompression takes them
  /// (string keys and values): kv.set_gradient_compression({{"type", "2bit"}, {"threshold",
  /// "0.5"}}). "type": MXNet's "2bit" or "none", or kvstore's "fp16", "bf16", "bf16_trunc";
  /// "threshold": 2bit's, a number (default 0.5, MXNet's). Throws kvstore::error:
  /// invalid_argument (no type, an unknown type or parameter, a threshold that is not a finite
  /// number > 0), and what the typed call throws.
  void set_gradient_compression(const std::map<std::string, std::string>& params) {
    set_gradient_compression(parse_compression(params));
  }

 private:
  using erased_store_dist = detail::erased_store::dist_store;

  // Everything a live store holds, in one place so that dispose() and a move are one pointer.
  struct state {
    std::string name;
    std::unique_ptr<detail::erased_store> store;
    std::mutex m;  ///< guards shapes
    std::unordered_map<std::uint64_t, detail::key_shape> shapes;
  };

  KVStore(std::string_view name, std::unique_ptr<detail::erased_store> store)
      : s_(std::make_unique<state>()) {
    s_->name = std::string(name);
    s_->store = std::move(store);
  }

  state& live(std::string_view call) const {
    if (!s_)
      throw error(errc::shutdown, "kvstore: mxnet::KVStore::" + std::string(call) +
                                      ": the store was disposed (or moved from)");
    return *s_;
  }

  static detail::key_shape shape_of(state& s, const key& k) {
    std::lock_guard lk(s.m);
    auto it = s.shapes.find(k.id());
    if (it == s.shapes.end()) fail(errc::unknown_key, k, "never inited");
    if (it->second.row_length == 0)
      fail(errc::not_a_matrix, k,
           "it was inited without a row_length, so it is not row_sparse "
           "(init(key, value, row_length) makes one)");
    return it->second;
  }

  [[noreturn]] static void fail(errc c, const key& k, const std::string& problem) {
    throw error(c, "kvstore: row_sparse_pull of key " + k.str() + ": " + problem);
  }

  static compression parse_compression(const std::map<std::string, std::string>& params) {
    const auto bad = [](const std::string& problem) {
      return error(errc::invalid_argument,
                   "kvstore: mxnet::KVStore::set_gradient_compression: " + problem);
    };
    static constexpr std::pair<std::string_view, compression::kind> types[] = {
        {"none", compression::none},
        {"2bit", compression::two_bit},
        {"fp16", compression::fp16},
        {"bf16", compression::bf16},
        {"bf16_trunc", compression::bf16_trunc}};
    compression c;
    bool typed = false;
    for (const auto& [name, value] : params) {
      if (name == "type") {
        const auto* t = std::find_if(std::begin(types), std::end(types),
                                     [&](const auto& e) { return e.first == value; });
        if (t == std::end(types))
          throw bad("type \"" + value + "\" is not one of none, 2bit, fp16, bf16, bf16_trunc");
        c.type = t->second;
        typed = true;
      } else if (name == "threshold") {
        std::size_t used = 0;
        float th = 0;
        try {
          th = std::stof(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != value.size() || !(std::isfinite(th) && th > 0))
          throw bad("threshold \"" + value + "\" is not a finite number greater than 0");
        c.threshold = th;
      } else {
        throw bad("unknown parameter \"" + name + "\" (the parameters are type and threshold)");
      }
    }
    if (!typed) throw bad("no \"type\" (one of none, 2bit, fp16, bf16, bf16_trunc)");
    return c;
  }

  // The servers take their mode from KVSTORE_TYPE where they start: a name that says otherwise
  // would make this worker believe in a mode its servers do not run.
  static void check_env_type(std::string_view name, bool sync) {
    const char* v = std::getenv("KVSTORE_TYPE");
    if (!v || !*v) return;
    const bool env_sync = std::string_view(v) != "dist_async";
    if (env_sync != sync)
      throw error(errc::invalid_argument, "kvstore: mxnet::KVStore::create(\"" + std::string(name) +
                                              "\"): KVSTORE_TYPE=" + v + " says the servers run " +
                                              (env_sync ? "dist_sync" : "dist_async"));
  }

  std::unique_ptr<state> s_;
};

}  // namespace kvstore::compat::mxnet

// ---- "device": only where <kvstore/device.hpp> (and so Thrust) came before this header --------
#if defined(KVSTORE_DEVICE_CUDA)
#include <kvstore/device.hpp>

namespace kvstore::compat::mxnet::detail {

/// The devices "device" spreads keys over: every visible GPU; on the OMP build (no GPUs, the
/// host is the one device) a single virtual device.
inline std::vector<int> visible_devices() {
  if (!kvstore::detail::rt::is_cuda) return {0};
  const int n = kvstore::detail::rt::device_count();
  if (n <= 0)
    throw error(errc::unsupported,
                "kvstore: mxnet::KVStore::create(\"device\"): no GPU is visible");
  std::vector<int> ds(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ds[static_cast<std::size_t>(i)] = i;
  return ds;
}

inline std::unique_ptr<erased_store> make_device_store() {
  return std::make_unique<store_model<kvstore::KVStore<kvstore::device, float>>>(
      device_options{.devices = visible_devices()});
}

/// Registers the device store with create() before main() runs.
inline const bool device_store_registered = (device_factory() = &make_device_store, true);

}  // namespace kvstore::compat::mxnet::detail
#endif
