// SINGA's "data partition within group" (apache/singa#1) over a kvstore store: N worker threads
// of one process train one model on sub-batches of each batch and share its parameters. The
// owner of a parameter puts it once; every worker sends its gradient of each step to the group
// (SINGA's stub), and the N-th arrival pushes the group's mean to the store, once: exactly one
// optimizer step per parameter per step (SINGA once averaged twice). Steps are numbered from 0,
// as SINGA's Worker::step_: update of step s makes version s + 1, and collect(step) at the start
// of step s waits for version s (collect(0): the put value), as SINGA's Collect waits for the
// param's version to pass the last one.
//
// Over KVStore<local> the group is the whole job. Over KVStore<dist> each process is one group
// and pushes its group's mean:
//   dist_sync   a round sums the groups' pushes, so each group sends mean / G (G = the store's
//               num_workers(), the groups): the step is the mean over every worker of the job,
//               the same step as one group of N * G threads, and the learning rate needs no
//               change when the job grows.
//   dist_async  each group's push is its own optimizer step (SINGA's asynchronous groups), not
//               divided; the servers' bounded staleness (dist_options::staleness) keeps a
//               group's collect from running more than that many steps ahead of the others.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/op.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::compat::singa {

struct group_options {
  /// The longest any call waits for the group: a put that never comes, a step's gradients from
  /// the other workers. Past it the call throws errc::timeout naming the param and the step.
  std::chrono::milliseconds timeout{60'000};
};

/// N threads of one process sharing one store (KVStore<local, T> or KVStore<dist, T>); every
/// call may come from any of them at once. A param is a key of the store; the group does not
/// set an optimizer (set one on the store: the group's pushes are gradients).
template <class Store>
class WorkerGroup {
  using T = typename Store::value_type;

 public:
  /// Throws kvstore::error(invalid_argument) for num_workers < 1.
  WorkerGroup(Store& store, int num_workers, group_options o = {})
      : store_(store), workers_(num_workers), opts_(o) {
    if (num_workers < 1)
      throw error(errc::invalid_argument,
                  "kvstore: singa: WorkerGroup needs at least one worker, not " +
                      std::to_string(num_workers));
    // dist_sync sums the groups' pushes in a round: divide by them too (see the top of the file).
    const T groups = static_cast<T>(store.type() == "dist_sync" ? store.num_workers() : 1);
    scale_ = T(1) / (static_cast<T>(num_workers) * groups);
  }
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  /// Waits for the pushes in flight (their buffers are the group's).
  ~WorkerGroup() {
    std::lock_guard lk(m_);
    for (auto& [id, p] : params_)
      for (auto& [step, f] : p.in_flight) error_of(f.o);
  }

  int num_workers() const { return workers_; }

  /// The owner's put: stores `value` as the param (init of the key; over dist every process's
  /// group puts it, and rank 0's value is kept). Once per param. Throws kvstore::error: a worker
  /// out of range, a second put, what the store's init throws.
  void put(int worker, key param, std::span<const T> value) {
    check_worker("put", worker, param);
    {
      std::lock_guard lk(m_);
      param_state& p = params_[param.id()];
      if (p.put || p.putting)
        throw error(errc::already_inited, "kvstore: singa: put of param " + param.str() +
                                              " by worker " + std::to_string(worker) +
                                              ": already put by worker " + std::to_string(p.owner));
      p.putting = true;
      p.owner = worker;
    }
    try {
      store_.init(param, value);
    } catch (...) {
      std::lock_guard lk(m_);
      params_[param.id()].putting = false;
      throw;
    }
    std::lock_guard lk(m_);
    param_state& p = params_[param.id()];
    p.putting = false;
    p.put = true;
    p.size = value.size();
    p.last_step.assign(static_cast<std::size_t>(workers_), 0);
    cv_.notify_all();
  }

  /// Worker `worker`'s gradient of `param` for `step` (0, 1, 2, ... for each worker and param,
  /// SINGA's numbering: step s's push makes version s + 1). Returns at once for the first N - 1
  /// workers of a step; the N-th pushes the group's mean (one push: one optimizer step) and
  /// returns once it is issued. Waits (bounded) for the put.
  /// Throws kvstore::error: a worker out of range, a size other than the param's, a step out of
  /// order, an earlier push of the param that failed, the put not coming in time.
  void update(int worker, key param, std::span<const T> grad, int step) {
    check_worker("update", worker, param);
    const std::string call = "update of param " + param.str() + " step " + std::to_string(step) +
                             " by worker " + std::to_string(worker);
    std::unique_lock lk(m_);
    param_state& p = wait_for(lk, call, param, [&](const param_state& s) { return s.put; });
    if (grad.size() != p.size)
      throw error(errc::size_mismatch, "kvstore: singa: " + call + ": " +
                                           std::to_string(grad.size()) + " values, the param " +
                                           std::to_string(p.size));
    // Internally a step is the version its push makes: step + 1.
    int& sent = p.last_step[static_cast<std::size_t>(worker)];  // versions this worker sent
    if (step != sent)
      throw error(errc::invalid_argument,
                  "kvstore: singa: " + call + ": the worker's next step is " +
                      std::to_string(sent) + " (each worker sends steps 0, 1, 2, ... once each)");
    const int version = step + 1;
    rethrow_failed(p);
    gathering& g = p.open[version];
    if (g.slots.empty()) g.slots.resize(static_cast<std::size_t>(workers_));
    std::vector<T>& mine = g.slots[static_cast<std::size_t>(worker)];
    take_spare(p, mine);
    sent = version;
    lk.unlock();
    // This worker's share of the mean, outside the lock: the slot is this worker's alone.
    for (std::size_t i = 0; i < grad.size(); ++i) mine[i] = grad[i] * scale_;
    lk.lock();
    if (++g.arrived < workers_) return;

    // The N-th: one push of the N shares (the store sums them), issued before this worker can
    // send its next step, so the group's pushes reach the store in step order.
    std::vector<std::vector<T>> shares = std::move(g.slots);
    p.open.erase(version);
    lk.unlock();
    std::vector<key> ks(shares.size(), param);
    std::vector<std::span<const T>> values(shares.begin(), shares.end());
    op o;
    try {
      o = store_.push(std::span<const key>(ks), std::span<const std::span<const T>>(values));
    } catch (...) {
      lk.lock();
      p.failed = std::current_exception();
      cv_.notify_all();
      throw;
    }
    lk.lock();
    prune(p);
    p.pushed = version;
    p.in_flight.emplace(version, flight{std::move(o), std::move(shares)});
    cv_.notify_all();
  }

  /// Waits until the group's push making version `step` was issued (that of step - 1; step 0:
  /// the put), then reads the param into `out`: the store's value at version >= step. Throws
  /// kvstore::error: a worker out of range, a size other than the param's, the push of that step
  /// failing, the step not complete within group_options::timeout (naming how many of the group's
  /// gradients arrived).
  void collect(int worker, key param, int step, std::span<T> out) {
    check_worker("collect", worker, param);
    const std::string call = "collect of param " + param.str() + " step " + std::to_string(step) +
                             " by worker " + std::to_string(worker);
    op pushed;
    {
      std::unique_lock lk(m_);
      param_state& p = wait_for(lk, call, param, [&](const param_state& s) {
        return (s.put && s.pushed >= step) || s.failed;
      });
      rethrow_failed(p);
      if (out.size() != p.size)
        throw error(errc::size_mismatch, "kvstore: singa: " + call + ": room for " +
                                             std::to_string(out.size()) +
                                             " values, the param has " + std::to_string(p.size));
      if (auto f = p.in_flight.find(step); f != p.in_flight.end()) pushed = f->second.o;
    }
    pushed.wait();  // its error is this step's (the pull below would not show it)
    store_.pull(param, out).wait();
  }

  /// The param's version in the store: pushes applied (local, dist_async: every group's) or
  /// rounds completed (dist_sync). Throws unknown_key before the put.
  std::uint64_t version(key param) { return store_.version(param); }

 private:
  struct gathering {                    // one step's gradients, as they arrive
    std::vector<std::vector<T>> slots;  // worker w's share in slots[w]
    int arrived = 0;
  };
  struct flight {  // a push issued: its op and the buffers it reads
    op o;
    std::vector<std::vector<T>> shares;
  };
  struct param_state {
    bool putting = false, put = false;
    int owner = -1;
    std::size_t size = 0;
    std::vector<int> last_step;         // each worker's steps sent so far (its next step)
    std::map<int, gathering> open;      // by the version each makes: steps still gathering
    int pushed = 0;                     // the last version pushed (steps pushed)
    std::map<int, flight> in_flight;    // by version
    std::vector<std::vector<T>> spare;  // buffers of finished pushes, for the next steps
    std::exception_ptr failed;          // a push that failed: every later call throws it
  };

  void check_worker(const char* call, int worker, const key& param) const {
    if (worker < 0 || worker >= workers_)
      throw error(errc::invalid_argument, std::string("kvstore: singa: ") + call + " of param " +
                                              param.str() + ": worker " + std::to_string(worker) +
                                              " is not in [0, " + std::to_string(workers_) + ")");
  }

  /// Waits (lock held) until ready(state) or the deadline; the error names what was missing.
  template <class Ready>
  param_state& wait_for(std::unique_lock<std::mutex>& lk, const std::string& call, const key& param,
                        Ready ready) {
    const auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
    const std::uint64_t id = param.id();
    if (cv_.wait_until(lk, deadline, [&] { return ready(params_[id]); })) return params_[id];
    const param_state& p = params_[id];
    std::string why;
    if (!p.put) {
      why = "the param was never put (its owner puts it once)";
    } else {
      int arrived = 0;
      for (auto& [v, g] : p.open)
        if (v == p.pushed + 1) arrived = g.arrived;
      why = "the group pushed " + std::to_string(p.pushed) + " step(s), up to version " +
            std::to_string(p.pushed) + "; step " + std::to_string(p.pushed) + " has " +
            std::to_string(arrived) + " of " + std::to_string(workers_) + " workers' gradients";
    }
    throw error(errc::timeout, "kvstore: singa: " + call + ": not ready after " +
                                   std::to_string(opts_.timeout.count()) + " ms: " + why);
  }

  void rethrow_failed(const param_state& p) const {
    if (p.failed) std::rethrow_exception(p.failed);
  }

  /// A buffer of the param's size for a share, from the spares when there is one.
  void take_spare(param_state& p, std::vector<T>& b) {
    if (!p.spare.empty()) {
      b = std::move(p.spare.back());
      p.spare.pop_back();
    }
    b.resize(p.size);
  }

  /// Drops finished pushes (their buffers become spares); a failed one fails the param.
  void prune(param_state& p) {
    for (auto it = p.in_flight.begin(); it != p.in_flight.end() && it->second.o.ready();) {
      if (auto e = error_of(it->second.o); e && !p.failed) p.failed = e;
      for (auto& b : it->second.shares)
        if (p.spare.size() < static_cast<std::size_t>(2 * workers_))
          p.spare.push_back(std::move(b));
      it = p.in_flight.erase(it);
    }
  }

  static std::exception_ptr error_of(const op& o) noexcept {
    try {
      o.wait();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  Store& store_;
  const int workers_;
  const group_options opts_;
  T scale_;
  std::mutex m_;
  std::condition_variable cv_;
  std::unordered_map<std::uint64_t, param_state> params_;
};

}  // namespace kvstore::compat::singa
