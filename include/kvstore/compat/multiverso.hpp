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
// dist_async too. The options and a worker's session are compat/multiverso/session.hpp; this file
// is Multiverso's calls and its two table handlers.
#pragma once

#include <kvstore/compat/multiverso/session.hpp>
#include <kvstore/error.hpp>
#include <kvstore/kvstore.hpp>  // with the server loop: launched SPMD, init() serves instead
#include <kvstore/options.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::compat::multiverso {

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
