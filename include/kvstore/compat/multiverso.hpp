// Multiverso's worker API (its Torch/Python bindings: init, barrier, shutdown, num_workers,
// worker_id, ArrayTableHandler, MatrixTableHandler) over a kvstore store. A thin layer: a table
// is one key of the store (a matrix key for MatrixTable), an add is a push, a get a pull, and
// Multiverso's server-side updater is the store's optimizer:
//   default       w += delta                          optim::add
//   sgd           w -= delta (the worker sends lr*g)  optim::sgd{lr 1}
//   momentum_sgd  s = m*s + (1-m)*delta; w -= s       optim::sgd{lr 1-m, momentum m}
// (with mom = -s, sgd's `mom = m*mom - (1-m)*delta; w += mom` is the same step), so a plain
// kv_server serves every updater.
//
// Multiverso applies each worker's add on its own, as it arrives, and its -sync mode only holds
// a worker's get until every worker's adds have caught up ("a worker's i-th get sees every
// worker's first i adds"). That is dist_async with bounded staleness 0, not dist_sync rounds:
// a round would sum the workers' adds into one update (a different momentum_sgd step) and would
// need every worker to add every table equally often. So the job runs dist_async (with
// staleness 0 when options.sync); init checks the environment says so, and that the servers run
// dist_async too.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/kvstore.hpp>  // with the server loop: launched SPMD, init() serves instead
#include <kvstore/options.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
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

/// Multiverso's MV_Init: joins the job (KVStore<dist> from the environment, or options::dist),
/// or makes a local store (options::store), and sets the updater. Call once, before any table.
/// Launched SPMD (mpirun), a server or scheduler process serves here and exits when the job
/// ends. Throws kvstore::error: init twice, an unknown updater, a job not dist_async (or, with
/// sync, not staleness 0), what the store's constructor throws.
inline void init(const options& o = {}) {
  auto& sl = detail::slots::get();
  auto& mine = o.per_thread ? detail::slots::thread() : sl.process;
  // Held through the store's construction, so two threads cannot both init the process's worker.
  std::unique_lock lk(sl.m, std::defer_lock);
  if (!o.per_thread) lk.lock();
  if (mine && !mine->closed())
    throw error(errc::invalid_argument, "kvstore: multiverso: init() twice (shutdown() first)");
  mine = std::make_shared<detail::session>(o);
}

/// Multiverso's MV_Barrier: waits for this worker's adds, then for every worker to reach it.
inline void barrier() { detail::current("barrier()")->barrier(); }

/// Multiverso's MV_ShutDown: waits for this worker's adds and leaves the job. Tables made before
/// refuse every later call; init() may start again. Throws an add's error (after leaving).
inline void shutdown() { detail::current("shutdown()")->shutdown(); }

/// Multiverso's MV_NumWorkers.
inline int num_workers() { return detail::current("num_workers()")->num_workers(); }

/// Multiverso's MV_WorkerId: 0 .. num_workers() - 1.
inline int worker_id() { return detail::current("worker_id()")->rank(); }

namespace detail {

/// What both handlers share: their worker, number, key, shape and the checks of their calls.
class table_base {
 protected:
  table_base(const char* kind, std::size_t rows, std::size_t cols, std::span<const float> init,
             bool matrix)
      : rows_(rows), cols_(cols), matrix_(matrix) {
    const std::string made = std::string(kind) + "(" + shape() + ")";
    s_ = current(made);
    if (rows == 0 || cols == 0)
      throw error(errc::invalid_argument, "kvstore: multiverso: " + made + ": an empty table");
    if (!init.empty() && init.size() != size())
      throw error(errc::size_mismatch, "kvstore: multiverso: " + made + ": init_value has " +
                                           std::to_string(init.size()) + " elements, the table " +
                                           std::to_string(size()));
    id_ = s_->next_table();
    name_ = std::string(matrix ? "MatrixTable " : "ArrayTable ") + std::to_string(id_) + " (" +
            shape() + ")";
    key_ = "multiverso.table." + std::to_string(id_);
    // Worker 0's initial value is stored (Multiverso adds it from worker 0 only); the others
    // give zeros of the same size, so the store can check that every worker agrees on it.
    std::vector<float> zeros;
    if (init.empty()) {
      zeros.assign(size(), 0.0f);
      init = zeros;
    }
    s_->with_store(name_ + ": creation", [&](auto& kv) {
      if (matrix)
        kv.init(key_, init, cols_);
      else
        kv.init(key_, init);
    });
  }

  std::size_t size() const { return rows_ * cols_; }
  std::string shape() const {
    return matrix_ ? std::to_string(rows_) + " x " + std::to_string(cols_) : std::to_string(rows_);
  }

  [[noreturn]] void fail(errc c, const std::string& call, const std::string& what) const {
    throw error(c, "kvstore: multiverso: " + name_ + ": " + call + ": " + what);
  }
  void check_size(const std::string& call, std::size_t n, std::size_t want) const {
    if (n != want)
      fail(errc::size_mismatch, call,
           std::to_string(n) + " values, expected " + std::to_string(want));
  }
  void check_rows(const std::string& call, std::span<const std::int64_t> ids) const {
    for (std::int64_t r : ids)
      if (r < 0 || static_cast<std::uint64_t>(r) >= rows_)
        fail(errc::row_out_of_range, call,
             "row " + std::to_string(r) + " is out of range [0, " + std::to_string(rows_) + ")");
  }

  /// Pushes a copy of `data` (and of `row_ids`), waiting for it when `sync`.
  void add_copy(const std::string& call, std::span<const float> data,
                std::span<const std::int64_t> row_ids, bool sync) {
    auto keep = std::make_shared<std::pair<std::vector<float>, std::vector<std::int64_t>>>(
        std::vector<float>(data.begin(), data.end()),
        std::vector<std::int64_t>(row_ids.begin(), row_ids.end()));
    op o = s_->with_store(name_ + ": " + call, [&](auto& kv) {
      if (keep->second.empty()) return kv.push(key_, std::span<const float>(keep->first));
      return kv.push_rows(key_, keep->second, keep->first);
    });
    if (sync)
      o.wait();
    else
      s_->track(std::move(o), std::move(keep));
  }

  std::vector<float> pull_copy(const std::string& call, std::span<const std::int64_t> row_ids) {
    std::vector<float> out((row_ids.empty() ? rows_ : row_ids.size()) * cols_);
    s_->with_store(name_ + ": " + call, [&](auto& kv) {
        if (row_ids.empty()) return kv.pull(key_, std::span<float>(out));
        return kv.pull_rows(key_, row_ids, out);
      }).wait();
    return out;
  }

  std::shared_ptr<session> s_;
  std::size_t rows_, cols_;
  bool matrix_;
  int id_ = -1;
  std::string name_;
  key key_ = 0;
};

}  // namespace detail

/// Multiverso's ArrayTableHandler: a one-dimensional table of `size` floats, on every worker the
/// same (the n-th table made is key "multiverso.table.<n>" on every worker). Every worker makes
/// its tables in the same order; creation returns once the table is stored.
class ArrayTableHandler : detail::table_base {
 public:
  /// Throws kvstore::error: before init, size 0, an init_value of another size.
  explicit ArrayTableHandler(std::size_t size, std::span<const float> init_value = {})
      : table_base("ArrayTableHandler", size, 1, init_value, false) {}

  /// Adds `delta` through the updater. With sync false it returns at once (the values are
  /// copied; an error shows at a later call of this worker: get, add, barrier or shutdown); a
  /// later get of this worker sees it either way. Throws: a size other than the table's, after
  /// shutdown; nothing is sent then.
  void add(std::span<const float> delta, bool sync = false) {
    check_size("add", delta.size(), size());
    add_copy("add", delta, {}, sync);
  }

  /// The table's values (with options.sync, after every worker's adds up to this worker's own
  /// count).
  std::vector<float> get() { return pull_copy("get", {}); }

  /// The table's number (creation order) and its store key.
  int table_id() const { return id_; }
  const key& store_key() const { return key_; }
};

/// Multiverso's MatrixTableHandler: `rows` x `cols` floats, row-major, added and read by rows.
class MatrixTableHandler : detail::table_base {
 public:
  /// Throws kvstore::error: before init, an empty shape, an init_value of another size.
  MatrixTableHandler(std::size_t rows, std::size_t cols, std::span<const float> init_value = {})
      : table_base("MatrixTableHandler", rows, cols, init_value, true) {}

  /// Adds `data` to the rows `row_ids` (row after row; a row named twice gets both), or with no
  /// row ids to the whole table. Throws: a row out of range, a size other than
  /// row_ids.size() * cols (or rows * cols), after shutdown; nothing is sent then.
  void add(std::span<const float> data, std::span<const std::int64_t> row_ids = {},
           bool sync = false) {
    check_rows("add", row_ids);
    check_size("add", data.size(), (row_ids.empty() ? rows_ : row_ids.size()) * cols_);
    add_copy("add", data, row_ids, sync);
  }
  void add(std::span<const float> data, std::initializer_list<std::int64_t> row_ids,
           bool sync = false) {
    add(data, std::span<const std::int64_t>(row_ids.begin(), row_ids.size()), sync);
  }

  /// The rows `row_ids`, in the order asked (repeats allowed), or with none the whole table.
  /// Throws: a row out of range, after shutdown.
  std::vector<float> get(std::span<const std::int64_t> row_ids = {}) {
    check_rows("get", row_ids);
    return pull_copy("get", row_ids);
  }
  std::vector<float> get(std::initializer_list<std::int64_t> row_ids) {
    return get(std::span<const std::int64_t>(row_ids.begin(), row_ids.size()));
  }

  int table_id() const { return id_; }
  const key& store_key() const { return key_; }
};

}  // namespace kvstore::compat::multiverso
