// Multiverso's options and one worker's session under compat/multiverso.hpp: its store (dist or
// local) with the updater set, the table numbers handed out, the adds still in flight; and the
// current worker of the process, or of the calling thread.
#pragma once

#include <kvstore/detail/env.hpp>
#include <kvstore/error.hpp>
#include <kvstore/kvstore.hpp>  // with the server loop: launched SPMD, a store's construction serves
#include <kvstore/options.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::compat::multiverso {

/// Which store holds the tables.
enum class store_kind {
  dist,   ///< KVStore<dist>: one worker of a job (launched by kv_launch, mpirun, srun, ...)
  local,  ///< KVStore<local>: one process alone (num_workers() == 1)
};

/// Multiverso's flags (-sync, -updater_type, AddOption's learning_rate and momentum), plus where
/// the tables live.
struct options {
  /// Multiverso's -sync: a worker's i-th get sees every worker's first i adds (staleness 0).
  bool sync = false;
  /// The servers' updater: "default" (w += delta), "sgd" (w -= delta) or "momentum_sgd".
  std::string updater = "default";
  /// Multiverso's AddOption learning rate: its sgd worker multiplies its gradients by it before
  /// add, so none of the three updaters reads it (kept so Multiverso programs keep their flags).
  double learning_rate = 0.01;
  /// momentum_sgd's m, in [0, 1).
  double momentum = 0.0;

  // ---- additions ----
  store_kind store = store_kind::dist;
  /// The job's options in code; unset: dist_options::from_env() (kv_launch, mpirun, srun...).
  std::optional<dist_options> dist = std::nullopt;
  /// The worker belongs to the calling thread, not to the process: several workers as threads
  /// of one process (tests). Calls on that thread use it; tables keep the worker they were
  /// made with.
  bool per_thread = false;
};

namespace detail {

using dist_store = KVStore<kvstore::dist, float>;
using local_store = KVStore<kvstore::local, float>;

/// One worker's state between init and shutdown: its store, the table numbers handed out, and
/// the adds still in flight (their values are copies, kept until the push is done).
class session {
  /// f(the store): both kinds give the same calls. (Defined first: callers need its type.)
  template <class F>
  decltype(auto) visit(F&& f) {
    if (local_) return f(*local_);
    return f(*dist_);
  }

 public:
  explicit session(const options& o) {
    if (o.store == store_kind::local)
      local_ = std::make_unique<local_store>();
    else
      dist_ = std::make_unique<dist_store>(job_options(o));
    visit([&](auto& kv) { set_updater(kv, o); });
    rank_ = visit([](auto& kv) { return kv.rank(); });
    workers_ = visit([](auto& kv) { return kv.num_workers(); });
    if (dist_) check_servers_async(*dist_);
  }

  int rank() const { return rank_; }
  int num_workers() const { return workers_; }

  /// Runs f(store) for a table's call; throws when the session was shut down.
  template <class F>
  decltype(auto) with_store(const std::string& what, F&& f) {
    std::shared_lock lk(m_);
    if (closed_) throw error(errc::shutdown, "kvstore: multiverso: " + what + " after shutdown()");
    return visit(std::forward<F>(f));
  }

  /// The next table's number (Multiverso numbers tables in creation order on every worker).
  int next_table() {
    std::lock_guard lk(pending_m_);
    return tables_++;
  }

  /// An add not waited for: its op and the copies its buffers point into.
  void track(op o, std::shared_ptr<const void> buffers) {
    std::lock_guard lk(pending_m_);
    std::erase_if(pending_, [&](const in_flight& p) {
      if (!p.o.ready()) return false;
      keep_first(error_of(p.o));
      return true;
    });
    pending_.push_back({std::move(o), std::move(buffers)});
  }

  /// Waits for every add in flight; throws the first error of one (once).
  void settle() {
    std::vector<in_flight> all;
    {
      std::lock_guard lk(pending_m_);
      all.swap(pending_);
    }
    std::exception_ptr e;
    for (auto& p : all)
      if (auto x = error_of(p.o); x && !e) e = x;
    std::lock_guard lk(pending_m_);
    keep_first(e);
    if (auto first = std::exchange(failed_, nullptr)) std::rethrow_exception(first);
  }

  void barrier() {
    settle();
    with_store("barrier()", [](auto& kv) { kv.barrier(); });
  }

  /// Waits for the adds in flight, then closes the store (dist: meets the other workers at its
  /// exit barrier). Throws the first error of an add, after closing.
  void shutdown() {
    std::exception_ptr first;
    try {
      settle();
    } catch (...) {
      first = std::current_exception();
    }
    {
      std::unique_lock lk(m_);
      closed_ = true;
      local_.reset();
      dist_.reset();
    }
    if (first) std::rethrow_exception(first);
  }

  bool closed() const {
    std::shared_lock lk(m_);
    return closed_;
  }

 private:
  struct in_flight {
    op o;
    std::shared_ptr<const void> keep;
  };

  // Waits for an add; its error, if any.
  static std::exception_ptr error_of(const op& o) noexcept {
    try {
      o.wait();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }
  // Keeps the first error of an add for the next settle() (pending_m_ held).
  void keep_first(std::exception_ptr e) {
    if (e && !failed_) failed_ = std::move(e);
  }

  /// The job's options: Multiverso's server applies adds as they arrive (dist_async), and -sync
  /// is staleness 0. Unset in the environment, they are filled in here (so an SPMD launch's
  /// servers, built from these options, agree); set otherwise, init refuses to run.
  static dist_options job_options(const options& o) {
    dist_options d = o.dist ? *o.dist : dist_options::from_env();
    const bool from_env = !o.dist.has_value();
    const char* type_var = from_env ? "KVSTORE_TYPE" : "dist_options::sync";
    const char* stale_var = from_env ? "KVSTORE_STALENESS" : "dist_options::staleness";
    const bool type_given = !from_env || kvstore::detail::env::get("KVSTORE_TYPE");
    const bool stale_given = !from_env || kvstore::detail::env::get("KVSTORE_STALENESS");
    if (!type_given) d.sync = false;
    if (!stale_given && o.sync) d.staleness = 0;
    if (d.sync)
      throw error(errc::invalid_argument,
                  std::string("kvstore: multiverso: init: ") + type_var +
                      " asks for dist_sync, but Multiverso applies each worker's add as it "
                      "arrives: run the job as dist_async (kv_launch --type dist_async)" +
                      (o.sync ? " with staleness 0 for -sync" : ""));
    if (o.sync && d.staleness != std::optional<std::uint64_t>(0))
      throw error(errc::invalid_argument,
                  std::string("kvstore: multiverso: init: -sync (options.sync) needs staleness 0, "
                              "but ") +
                      stale_var + " is " +
                      (d.staleness ? std::to_string(*d.staleness) : std::string("unbounded")) +
                      (from_env ? ": set KVSTORE_STALENESS=0 for the whole job" : ""));
    return d;
  }

  template <class Store>
  static void set_updater(Store& kv, const options& o) {
    // Every worker sets it before its first add (set_optimizer is not a collective, and the same
    // type again keeps the servers' state), so no add can reach a server before its updater.
    if (o.updater == "default") {
      kv.set_optimizer(optim::add{});
    } else if (o.updater == "sgd") {
      kv.set_optimizer(optim::sgd{.learning_rate = 1.0});
    } else if (o.updater == "momentum_sgd") {
      if (!(o.momentum >= 0.0 && o.momentum < 1.0))
        throw error(errc::invalid_argument,
                    "kvstore: multiverso: init: momentum_sgd needs a momentum in [0, 1), not " +
                        std::to_string(o.momentum));
      kv.set_optimizer(optim::sgd{.learning_rate = 1.0 - o.momentum, .momentum = o.momentum});
    } else {
      throw error(errc::invalid_argument, "kvstore: multiverso: init: unknown updater \"" +
                                              o.updater +
                                              "\": expected default, sgd or momentum_sgd");
    }
  }

  /// Servers started apart (kv_server under kv_launch) take their type from their own
  /// environment, which this worker cannot read: one push per worker to a probe key tells. A
  /// dist_async server counts every push (version == workers), a dist_sync one a round (1).
  void check_servers_async(dist_store& kv) {
    if (kv.num_workers() < 2) return;
    const key probe = "multiverso.server_type_probe";
    const std::vector<float> one{0.0f};
    kv.init(probe, one);
    kv.push(probe, one).wait();
    kv.barrier();
    const auto v = kv.version(probe);
    kv.barrier();  // nobody leaves (and may fail the job) before every worker has asked
    if (v != static_cast<std::uint64_t>(kv.num_workers()))
      throw error(errc::invalid_argument,
                  "kvstore: multiverso: init: the servers run dist_sync rounds (" +
                      std::to_string(kv.num_workers()) + " pushes counted as " + std::to_string(v) +
                      "), but Multiverso applies each add as it arrives: start the servers with "
                      "KVSTORE_TYPE=dist_async (kv_launch --type dist_async)");
  }

  mutable std::shared_mutex m_;         // calls share it; shutdown takes it alone
  std::unique_ptr<local_store> local_;  // one of the two, until shutdown
  std::unique_ptr<dist_store> dist_;
  bool closed_ = false;
  int rank_ = 0, workers_ = 1;
  std::mutex pending_m_;
  int tables_ = 0;
  std::vector<in_flight> pending_;
  std::exception_ptr failed_;
};

/// The process's worker, and the calling thread's (options::per_thread), which comes first.
struct slots {
  std::mutex m;
  std::shared_ptr<session> process;
  static slots& get() {
    static slots s;
    return s;
  }
  static std::shared_ptr<session>& thread() {
    thread_local std::shared_ptr<session> t;
    return t;
  }
};

/// The current worker; throws naming `call` before init() and after shutdown().
inline std::shared_ptr<session> current(const std::string& call) {
  std::shared_ptr<session> s = slots::thread();
  if (!s) {
    std::lock_guard lk(slots::get().m);
    s = slots::get().process;
  }
  if (!s)
    throw error(errc::invalid_argument,
                "kvstore: multiverso: " + call + " before multiverso::init()");
  if (s->closed())
    throw error(errc::shutdown, "kvstore: multiverso: " + call + " after multiverso::shutdown()");
  return s;
}

}  // namespace detail

}  // namespace kvstore::compat::multiverso
