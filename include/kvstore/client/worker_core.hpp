// detail::worker_core<T>: the parts of a worker (client/worker_store.hpp) that every call uses:
// its options, connections, request makers, engine and key table, joining and leaving the job,
// and the steps the calls share: finding a key's record with its checks, making an op, and the
// policy that sends a request batched (client/batch.hpp), fused (client/fusion.hpp) or pipelined
// behind the key's earlier ops.
#pragma once

#include <kvstore/client/batch.hpp>
#include <kvstore/client/call.hpp>
#include <kvstore/client/client.hpp>
#include <kvstore/client/colocated_roles.hpp>
#include <kvstore/client/fusion.hpp>
#include <kvstore/client/key_record.hpp>
#include <kvstore/client/key_table.hpp>
#include <kvstore/client/multi_key.hpp>
#include <kvstore/client/partition.hpp>
#include <kvstore/client/requests.hpp>
#include <kvstore/detail/block_pool.hpp>
#include <kvstore/detail/checks.hpp>
#include <kvstore/detail/group.hpp>
#include <kvstore/engine/engine.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>
#include <kvstore/reduce/cpu.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// What a worker is made of, and the steps its calls share (public: worker_store's calls and
/// the device calls of device/dist_calls.hpp use them).
template <class T>
class worker_core {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "KVStore<dist, T>: T must be float or double");

 public:
  using record = detail::key_record;
  using call_kind = detail::call_kind;

  /// Joins the job with options already resolved (dist_options::resolve_colocated) and, for a
  /// colocated worker, its own server already started (`roles`). Throws kvstore::error when the
  /// scheduler or a server cannot be reached within connect_timeout.
  worker_core(const dist_options& resolved, std::unique_ptr<colocated_roles> roles)
      : opts(resolved),
        roles(std::move(roles)),
        client(opts, this->roles ? this->roles->address() : own_server{}),
        reqs(client),
        batch(client),
        fuse(fusion<T>::make(client)),
        eng(opts.threads) {
    eng.set_max_pipeline(opts.pipeline_depth);  // ops of a key on the wire at most
  }
  worker_core(const worker_core&) = delete;
  worker_core& operator=(const worker_core&) = delete;
  /// Waits for every op, meets the other workers at a barrier (unless set_barrier_before_exit
  /// (false)), says goodbye to servers and scheduler. Never throws.
  ~worker_core() {
    try {
      eng.wait_all();
    } catch (...) {
    }
    if (opts.barrier_before_exit) {
      try {
        reqs.barrier(call_kind::barrier_before_exit, opts.barrier_timeout);
      } catch (const std::exception& e) {
        log_warn("worker", e.what());
      }
    }
    client.leave_job();
    // This process's server goes on serving the others until the job ends.
    if (roles) roles->linger(opts.barrier_timeout);
  }

  /// "dist_sync" or "dist_async".
  std::string type() const { return opts.type_name(); }
  int rank() const noexcept { return client.rank(); }
  int num_workers() const noexcept { return client.num_workers(); }
  int num_servers() const noexcept { return client.num_servers(); }
  /// Whether this process also serves a shard of the job (dist_options::colocated): then its
  /// server's rank is rank().
  bool colocated() const noexcept { return roles != nullptr; }

  // ---- the worker's parts -----------------------------------------------------------------
  dist_options opts;
  // Declared before the client: destroyed after it, so this worker's connections are closed
  // before its server lingers for the others.
  std::unique_ptr<detail::colocated_roles> roles;
  detail::worker_client client;
  detail::requests<T> reqs;
  detail::batches<T> batch;                 // multi-key calls' small keys
  std::shared_ptr<detail::fusion<T>> fuse;  // one-key pushes of small keys, fused while a
                                            // link is busy (the client shares it)
  detail::engine eng;  // destroyed before the client: no op outlives the network
  detail::key_table keys;
  detail::multi_key_calls<T> calls;  // splits multi-key calls; their plans
  std::atomic<bool> left{false};
  // The device work of device_span calls (device/dist_bridge.hpp), made on the first one.
  // Last: destroyed first, its completions drained while the engine and client still exist.
  std::once_flag device_once;
  std::shared_ptr<void> device;

  [[noreturn]] static void fail(errc c, call_kind call, const key& k, const std::string& problem) {
    detail::fail(c, detail::call_name(call), k, problem);
  }

  // The record of a key id, for the state calls.
  typename detail::requests<T>::key_lookup lookup() const {
    return [table = &keys](std::uint64_t id) -> const record* { return table->find(id); };
  }

  record* find(call_kind call, const key& k, std::optional<std::size_t> n) {
    return checked(keys.find(k.id()), call, k, n);
  }
  // The same with the key table held (key_table::read_lock).
  record* find_locked(call_kind call, const key& k, std::optional<std::size_t> n) {
    return checked(keys.find_locked(k.id()), call, k, n);
  }
  record* checked(record* m, call_kind call, const key& k, std::optional<std::size_t> n) {
    if (!m) fail(errc::unknown_key, call, k, "never inited");
    if (m->named || k.is_named())  // else both are the same integer: nothing more to read
      detail::check_same_name(detail::call_name(call), m->k, k);
    if (n) check_size(call, *m, *n);
    if (left && detail::is_push(call))
      fail(errc::invalid_argument, call, k, "this worker left the sync group (leave())");
    return m;
  }
  // The record of a key for a range op, with the range checked: errors name the key and range.
  record* find_range(call_kind call, const key& k, std::size_t offset, std::size_t n) {
    if (!keys.find(k.id()))
      fail(errc::unknown_key, call, k,
           "never inited (elements " + detail::range_str(offset, n) + ")");
    record* m = find(call, k, std::nullopt);
    detail::check_range(detail::call_name(call), m->k, m->total, offset, n);
    return m;
  }
  static void check_size(call_kind call, const record& m, std::size_t n) {
    detail::check_size(detail::call_name(call), m.k, m.total, n);
  }
  static void check_rows(call_kind call, const record& m, std::span<const std::int64_t> rows,
                         std::size_t n) {
    detail::check_rows(detail::call_name(call), m.k, m.total, m.row_length, rows, n);
  }

  void init_one(key k, std::span<const T> value, const init_options& o) {
    auto [m, fresh] = keys.add(make_record(k, value, o));
    if (!fresh) {
      detail::check_same_name("init", m->k, k);
      fail(errc::already_inited, call_kind::init, k, "inited twice");
    }
    auto st = send_init(*m, value);
    try {
      op(st).wait();
    } catch (...) {
      keys.remove(m->k.id());
      throw;
    }
  }

  // The record of a key about to be inited with `value`: its slices on the servers.
  std::unique_ptr<record> make_record(const key& k, std::span<const T> value,
                                      const init_options& o) const {
    if (value.empty()) fail(errc::invalid_argument, call_kind::init, k, "an empty value");
    if (o.partition != partition::hashed && o.partition != partition::even)
      fail(errc::invalid_argument, call_kind::init, k, "an unknown partition");
    auto slices = o.partition == partition::even
                      ? detail::partition_even(value.size(), o.row_length, num_servers())
                      : detail::partition(k.id(), value.size(), o.row_length, sizeof(T),
                                          num_servers(), opts.slice_bytes);
    return std::make_unique<record>(k, value.size(), o.row_length, std::move(slices), o.partition,
                                    o.compression);
  }

  // Sends the init of a key just added; the returned state completes with the answers.
  std::shared_ptr<detail::op_state> send_init(record& m, std::span<const T> value) {
    auto st = new_state(1);
    reqs.init(m, value, rank() == 0, [st](std::exception_ptr e) { st->complete_part(e); });
    return st;
  }

  // The shared state of a new op of `parts` parts; its wait() spins as the options say, and
  // first sends the pushes fusion holds back.
  std::shared_ptr<detail::op_state> new_state(std::size_t parts) const {
    auto st = detail::make_pooled<detail::op_state>(parts);
    st->spin_us = static_cast<unsigned>(opts.wait_spin.count());
    st->hurry = fuse->hook();
    return st;
  }

  // One op on key m: f(done) runs once the key's earlier ops let it go. A pipelined op lets
  // the key go once f returned (its frames are written or queued, in order), not when answered.
  template <class F>
  op submit(const record* m, int priority, F&& f, std::shared_ptr<detail::op_state> st = nullptr,
            bool pipelined = false) {
    // The caller's handle is made first and the state moved into the engine: each copy of the
    // shared_ptr is a locked increment, a full barrier on the caller's thread.
    op handle;
    if (!st) handle = op(st = new_state(1));
    // f is kept in the engine's op itself (engine_op_of), not in a std::function of its own; a
    // pipelined push's f also takes the run's pipelined_run (push_one), which the op passes.
    if (pipelined)
      eng.submit_pipelined(m->queue, priority, std::forward<F>(f), std::move(st),
                           /*may_run_inline=*/true);
    else
      eng.submit(m->queue, priority, std::forward<F>(f), std::move(st),
                 /*may_run_inline=*/true);
    return handle;
  }

  // Values above this do not pipeline: a server keeps what a worker sends ahead of an open sync
  // round (bounded by max_queued_bytes), and a large value's frames keep the link busy anyway.
  static constexpr std::size_t max_pipelined_bytes = std::size_t{64} << 10;

  // Whether a one-key push (pull false) or pull of m streams behind the key's earlier ops
  // (dist_options::pipeline_depth): its task writes one frame per server, in order, and nothing
  // may reorder them later (a push that fusion holds back keeps its key until answered instead:
  // push_one). Not with a re-send after a server restart (server_restart_wait), not a
  // compressed push (its key's encode buffer is reused), not a pull a server may hold for
  // staleness (a later push would overtake it), and not a value of several frames (bandwidth,
  // not round trips, bounds those).
  bool pipelines(const record& m, bool pull) const {
    const dist_options& o = opts;
    if (o.pipeline_depth < 2 || o.server_restart_wait.count() > 0 ||
        m.total > std::min(o.chunk_bytes, max_pipelined_bytes) / sizeof(T))
      return false;
    if (pull) return o.sync || !o.staleness;
    return reqs.travels_plain(m, false);
  }

  // A multi-key call split (client/multi_key.hpp): every key found and checked, the first bad
  // one throwing, naming it, before anything is queued.
  template <class Buf>
  detail::split_call<Buf> split(call_kind call, std::span<const key> ks,
                                std::span<const Buf> bufs) {
    const bool pull = call == call_kind::pull;
    const dist_options& o = opts;
    const typename detail::multi_key_calls<T>::call_context cx{
        keys, reqs, batch, /*batch_ok=*/!pull || o.sync || !o.staleness,
        /*follow_plans=*/pull || !left};
    return calls.split(call, ks, bufs, cx, [&](record* m, std::size_t i) {
      return checked(m, call, ks[i], bufs[i].size());
    });
  }

  // The small keys of a call, each batch one engine op over its keys; all in one batch when a
  // key is named twice (its buffers are summed, or each filled, together).
  template <class Buf, class Run>
  void submit_small(detail::split_call<Buf>& c, int priority,
                    const std::shared_ptr<detail::op_state>& st, Run run) {
    if (c.planned) {
      constexpr std::size_t batch_keys = detail::split_call<Buf>::batch_keys;
      for (std::size_t lo = 0; lo < c.planned->size(); lo += batch_keys)
        submit_batch(c.planned_batch(lo, std::min(c.planned->size(), lo + batch_keys)), priority,
                     st, run);
      return;
    }
    if (c.small.empty()) return;
    if (c.repeats) return submit_batch(calls.merged(c), priority, st, run);
    for (auto& b : c.small) submit_batch(std::move(b), priority, st, run);
  }

  // One op over all of the batch's keys: run(batch, done) once the engine gives it every key.
  template <class Buf, class Run>
  void submit_batch(std::shared_ptr<detail::batch<Buf>> b, int priority,
                    std::shared_ptr<detail::op_state> st, Run run) {
    std::vector<detail::key_slot*> slots(b->size());
    for (std::size_t j = 0; j < slots.size(); ++j) slots[j] = &b->entries[j].rec->queue;
    eng.submit(
        std::span<detail::key_slot* const>(slots), priority,
        [b = std::move(b), run](detail::engine::done_fn done) mutable { run(b, std::move(done)); },
        std::move(st), /*may_run_inline=*/true);
  }

  // One push of key m: fused with other small pushes to its server while that link is busy
  // (client/fusion.hpp), else sent now. Returns whether it was held back to be fused. A push
  // behind an op of its key still on the wire (back to back on one key) is sent now: it streams
  // behind that op, where a fused one would hold its key until answered.
  bool push_one(record& m, std::span<const T> value, int priority,
                detail::op_state::continuation done, bool behind_stream = false) {
    if (!behind_stream && detail::batches<T>::small(m) && reqs.travels_plain(m, false) &&
        fuse->push(m, value, priority, done))
      return true;
    reqs.push(m, value, priority, std::move(done));
    return false;
  }

  op submit_summed(record* m, std::vector<std::span<const T>> srcs, int priority,
                   std::shared_ptr<detail::op_state> st = nullptr) {
    if (srcs.size() == 1) {
      auto v = srcs.front();
      return submit(
          m, priority,
          [this, m, v, priority](auto done) { push_one(*m, v, priority, std::move(done)); }, st);
    }
    return submit(
        m, priority,
        [this, m, srcs = std::move(srcs), priority](auto done) {
          auto sum = std::make_shared<std::vector<T>>(m->total);
          reduce::sum_into<T>(std::span<T>(*sum), std::span<const std::span<const T>>(srcs));
          reqs.push(
              *m, std::span<const T>(*sum), priority,
              [sum, done](std::exception_ptr e) { done(e); }, sum);
        },
        st);
  }
};

}  // namespace kvstore::detail
