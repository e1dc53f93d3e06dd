// KVStore<dist, T>: a worker of a distributed job. The public calls and their argument checks
// live here; client/requests.hpp turns each op into frames for the servers holding the key's
// slices, and the engine orders ops per key. In a process whose role is server or scheduler
// (mpirun-style SPMD launches) the constructor runs that role instead, when the program was
// built with the server loop (kvstore.hpp or spmd.hpp), as MXNet does.
#pragma once

#include <kvstore/client/batch.hpp>
#include <kvstore/client/call.hpp>
#include <kvstore/client/client.hpp>
#include <kvstore/client/fusion.hpp>
#include <kvstore/client/key_record.hpp>
#include <kvstore/client/key_table.hpp>
#include <kvstore/client/multi_key.hpp>
#include <kvstore/client/partition.hpp>
#include <kvstore/client/requests.hpp>
#include <kvstore/detail/block_pool.hpp>
#include <kvstore/detail/checks.hpp>
#include <kvstore/detail/group.hpp>
#include <kvstore/device/span.hpp>  // device_span and the bridge's declaration: no Thrust, no CUDA
#include <kvstore/engine/engine.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>
#include <kvstore/reduce/cpu.hpp>
#include <kvstore/transport/tcp_congestion.hpp>

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

namespace kvstore {

namespace detail {
/// Runs the scheduler or server loop of a process whose role is not worker, then exits it. Set
/// by spmd.hpp, so a program that never serves does not compile the server loop.
inline void (*run_other_role)(const dist_options&) = nullptr;

/// What a colocated worker process (dist_options::colocated) runs beside its worker: its server,
/// and for rank 0 of an SPMD launch the scheduler, each on its own thread (kvstore/colocated.hpp).
/// Destroying it stops them and joins their threads; after linger() it first lets the server
/// serve the other workers until the job ends.
class colocated_roles {
 public:
  virtual ~colocated_roles() = default;
  /// Where this process's server listens, as it registers with the scheduler.
  virtual own_server address() const = 0;
  /// This worker said goodbye: on destruction, serve until the scheduler ends the job (every
  /// worker gone), at most `limit`, before stopping.
  virtual void linger(std::chrono::milliseconds limit) noexcept = 0;
};
/// Starts them; set by colocated.hpp (through kvstore.hpp), so a program that never serves does
/// not compile the server loop.
inline std::unique_ptr<colocated_roles> (*start_colocated)(const dist_options&) = nullptr;

/// Who sets the two pointers above: spmd.hpp specializes `loop_registrar<spmd_loop, T>` and
/// colocated.hpp `loop_registrar<colocated_loop, T>`, each with a `registered` whose initializer
/// sets its pointer before main(). KVStore<dist, T> names them with its own T, so only a source
/// file that constructs a store instantiates them and compiles the server and scheduler: one that
/// includes kvstore.hpp for the local store alone does not (g++ -O2 of the bare header: 29 s ->
/// 9 s). Without the header that specializes it, `registered` is false and sets nothing.
template <class Loop, class T>
struct loop_registrar {
  static constexpr bool registered = false;
};
struct spmd_loop;
struct colocated_loop;
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
  using record = detail::key_record;
  using call_kind = detail::call_kind;

 public:
  using value_type = T;

  /// Options from the environment (dist_options::from_env()).
  KVStore() : KVStore(dist_options::from_env()) {}
  /// Joins the job; throws kvstore::error when the scheduler or a server cannot be reached
  /// within connect_timeout. In a process whose role is server or scheduler this runs that role
  /// and exits the process when the job ends (the source file that constructs the store must
  /// include kvstore.hpp or spmd.hpp).
  explicit KVStore(const dist_options& o) {
    (void)detail::loop_registrar<detail::spmd_loop, T>::registered;
    if (o.role != role::worker) {
      if (!detail::run_other_role)
        throw error(errc::invalid_argument,
                    std::string("kvstore: this process's role is ") + detail::role_name(o.role) +
                        ", but the program was built without the server loop: include "
                        "<kvstore/kvstore.hpp> or <kvstore/spmd.hpp>");
      detail::run_other_role(o);
    }
    o.check_versions();
    transport::check_congestion(o.tcp_congestion);
    impl_ = std::make_unique<impl>(o);
  }
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;
  KVStore(KVStore&&) noexcept = default;
  KVStore& operator=(KVStore&&) noexcept = default;
  /// Waits for every op, meets the other workers at a barrier (unless set_barrier_before_exit
  /// (false)), says goodbye to servers and scheduler. Never throws.
  ~KVStore() = default;

  /// "dist_sync" or "dist_async".
  std::string type() const { return impl_->opts.type_name(); }
  int rank() const noexcept { return impl_->client.rank(); }
  int num_workers() const noexcept { return impl_->client.num_workers(); }
  int num_servers() const noexcept { return impl_->client.num_servers(); }
  /// Whether this process also serves a shard of the job (dist_options::colocated): then its
  /// server's rank is rank().
  bool colocated() const noexcept { return impl_->colocated != nullptr; }

  // ---- init ----------------------------------------------------------------------------------
  /// Stores rank 0's value (every worker calls init; each returns once the value is stored).
  /// Throws: init twice, a size that differs between workers, unreachable servers.
  void init(key k, std::span<const T> value) { init_one(std::move(k), value, {}); }
  /// A matrix of value.size() / row_length rows (for push_rows / pull_rows).
  void init(key k, std::span<const T> value, std::size_t row_length) {
    detail::check_matrix_init(k, value.size(), row_length);
    init_one(std::move(k), value, {.row_length = row_length});
  }
  /// With init_options: a matrix (row_length), the key's placement (partition::even: chunk i of
  /// BigDL's rule on server i, whatever the size) and its own wire compression.
  void init(key k, std::span<const T> value, const init_options& o) {
    if (o.row_length) detail::check_matrix_init(k, value.size(), o.row_length);
    detail::check_compression(o.compression, "init of key " + k.str() + ": init_options");
    init_one(std::move(k), value, o);
  }
  /// Every key is checked before any is sent (a misuse inits none of them); then all inits go
  /// out together and are answered together: one round trip for the lot, not one per key (the
  /// small keys of each server in a few batched frames). A key a server refuses is not inited;
  /// the others are, and the first error is thrown.
  void init(std::span<const key> ks, std::span<const std::span<const T>> values) {
    detail::check_count("init", ks.size(), "with", values.size(), "values");
    {
      auto lk = impl_->keys.read_lock();
      for (std::size_t i = 0; i < ks.size(); ++i) {
        if (values[i].empty())
          fail(errc::invalid_argument, call_kind::init, ks[i], "an empty value");
        if (const record* m = impl_->keys.find_locked(ks[i].id())) {
          detail::check_same_name("init", m->k, ks[i]);
          fail(errc::already_inited, call_kind::init, ks[i], "inited twice");
        }
      }
    }
    // The records, added under one lock (a key named twice is found there, its first record
    // marked by this call); the small keys batched, the others one by one.
    const std::uint64_t call = impl_->calls.next_call();
    std::vector<std::unique_ptr<record>> made;
    made.reserve(ks.size());
    for (std::size_t i = 0; i < ks.size(); ++i) {
      made.push_back(make_record(ks[i], values[i], {}));
      made.back()->batch_call = call;
    }
    std::vector<record*> added;
    added.reserve(ks.size());
    if (const std::size_t taken = impl_->keys.add_all(made, added); taken != ks.size()) {
      const record* other = impl_->keys.find(ks[taken].id());
      const bool twice = other && other->batch_call == call;
      for (record* m : added) impl_->keys.remove(m->k.id());
      if (twice) fail(errc::already_inited, call_kind::init, ks[taken], "named twice in one init");
      if (other) detail::check_same_name("init", other->k, ks[taken]);
      fail(errc::already_inited, call_kind::init, ks[taken], "inited twice");
    }
    detail::batch<std::span<const T>> small(impl_->calls.next_call(), ks.size());
    std::vector<std::pair<record*, std::shared_ptr<detail::op_state>>> sent;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      if (detail::batches<T>::small(*added[i]))
        small.add(added[i], ks[i].id(), values[i]);  // this call's new records: no lock needed
      else
        sent.emplace_back(added[i], send_init(*added[i], values[i]));
    }
    std::exception_ptr first;
    if (small.size()) {
      std::vector<char> failed(small.size(), 0);
      auto st = new_state(1);
      impl_->batch.init(small, rank() == 0, failed,
                        [st](std::exception_ptr e) { st->complete_part(e); });
      try {
        op(st).wait();
      } catch (...) {
        first = std::current_exception();
        for (std::size_t j = 0; j < small.size(); ++j)
          if (failed[j]) impl_->keys.remove(small.entries[j].rec->k.id());
      }
    }
    for (auto& [m, st] : sent) {
      try {
        op(st).wait();
      } catch (...) {
        impl_->keys.remove(m->k.id());
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  // ---- push / pull ---------------------------------------------------------------------------
  op push(key k, std::span<const T> value, int priority = 0) {
    record* m = find(call_kind::push, k, value.size());
    return submit(
        m, priority,
        [this, m, value, priority](auto done, detail::pipelined_run& run) {
          run.held_back = push_one(*m, value, priority, std::move(done), run.behind_stream);
        },
        nullptr, pipelines(*m, false));
  }
  /// Several devices' values of one key: summed here first, so one message per key leaves.
  op push(key k, std::initializer_list<std::span<const T>> values, int priority = 0) {
    if (values.size() == 0) fail(errc::invalid_argument, call_kind::push, k, "no values");
    std::vector<std::span<const T>> srcs(values.begin(), values.end());
    record* m = find(call_kind::push, k, srcs.front().size());
    for (auto& s : srcs) check_size(call_kind::push, *m, s.size());
    return submit_summed(m, std::move(srcs), priority);
  }
  /// The small keys (plain on the wire, whole on one server) go as one op over all of them, in a
  /// few batched frames per server; the others one op per key. A key named twice is summed.
  op push(std::span<const key> ks, std::span<const std::span<const T>> values, int priority = 0) {
    detail::check_count("push", ks.size(), "with", values.size(), "values");
    auto call = split(call_kind::push, ks, values);
    auto st = new_state(call.large.size() + call.batches());
    for (auto& [m, srcs] : call.large) submit_summed(m, std::move(srcs), priority, st);
    submit_small(call, priority, st, [this, priority](auto b, auto done) {
      impl_->batch.push(*b, priority, std::move(done));
    });
    return op(st);
  }

  op pull(key k, std::span<T> out, int priority = 0) {
    record* m = find(call_kind::pull, k, out.size());
    return submit(
        m, priority,
        [this, m, out, priority](auto done) {
          impl_->reqs.pull(*m, {out}, priority, std::move(done));
        },
        nullptr, pipelines(*m, true));
  }
  /// Each output gets the value.
  op pull(key k, std::initializer_list<std::span<T>> outs, int priority = 0) {
    if (outs.size() == 0) fail(errc::invalid_argument, call_kind::pull, k, "no outputs");
    std::vector<std::span<T>> o(outs.begin(), outs.end());
    record* m = find(call_kind::pull, k, o.front().size());
    for (auto& x : o) check_size(call_kind::pull, *m, x.size());
    return submit(
        m, priority,
        [this, m, o, priority](auto done) { impl_->reqs.pull(*m, o, priority, std::move(done)); },
        nullptr, pipelines(*m, true));
  }
  /// As the multi-key push: the small keys batched, the others one op per key. A key named
  /// twice fills each output.
  op pull(std::span<const key> ks, std::span<const std::span<T>> outs, int priority = 0) {
    detail::check_count("pull", ks.size(), "into", outs.size(), "outputs");
    auto call = split(call_kind::pull, ks, outs);
    auto st = new_state(call.large.size() + call.batches());
    for (auto& [m, o] : call.large)
      submit(
          m, priority,
          [this, m = m, o = o, priority](auto done) {
            impl_->reqs.pull(*m, o, priority, std::move(done));
          },
          st);
    submit_small(call, priority, st, [this, priority](auto b, auto done) {
      impl_->batch.pull(std::move(b), priority, std::move(done));
    });
    return op(st);
  }

  // ---- versions and bounded staleness ---------------------------------------------------------
  /// A pull that each server answers once its slice of `k` reached o.min_version (see
  /// version()), within request_timeout: a version not reached by then fails the op with an
  /// error naming the key and the version. Under dist_options::staleness it also waits for
  /// slower workers, as every pull does.
  op pull(key k, std::span<T> out, pull_options o) {
    record* m = find(call_kind::pull, k, out.size());
    return submit(m, o.priority, [this, m, out, o](auto done) {
      impl_->reqs.pull(*m, {out}, o.priority, std::move(done), o.min_version);
    });
  }

  /// The version of `k` on its servers: sync rounds completed (dist_sync) or pushes applied
  /// (dist_async), each push or round counted once even across a server restart. A key sliced
  /// over several servers has the least of its slices' versions. Asked after this worker's
  /// earlier ops on `k` are done, as a pull is. Throws unknown_key for a key never inited.
  std::uint64_t version(key k) {
    record* m = find(call_kind::version, k, std::nullopt);
    auto v = std::make_shared<std::uint64_t>(0);
    submit(m, 0, [this, m, v](auto done) { impl_->reqs.version(*m, v, std::move(done)); }).wait();
    return *v;
  }

  /// Push then pull of one key as one op: `out` gets the value after this push.
  op pushpull(key k, std::span<const T> value, std::span<T> out, int priority = 0) {
    record* m = find(call_kind::pushpull, k, value.size());
    check_size(call_kind::pushpull, *m, out.size());
    return submit(m, priority, [this, m, value, out, priority](auto done) {
      impl_->reqs.push(*m, value, priority, [this, m, out, priority, done](std::exception_ptr e) {
        if (e) return done(e);
        impl_->reqs.pull(*m, {out}, priority, done);
      });
    });
  }

  // ---- values on devices (MXNet's dist_device_sync; needs #include <kvstore/device.hpp>) -----
  // Several devices' values are summed on the first one's device, staged through the key's
  // pinned host buffer and pushed once; a pull lands in that buffer and is copied to each
  // device (device/dist_bridge.hpp does the device work). Same checks and results as the host
  // calls; besides, each device_span is checked at the call: its device exists and holds its
  // memory, its size is the key's (invalid_argument / size_mismatch naming the key and device).

  /// Stores rank 0's value (copied from its device first).
  void init(key k, device_span<const T> value) {
    const auto host = device_to_host(k, value);
    init_one(std::move(k), std::span<const T>(host), {});
  }
  void init(std::span<const key> ks, std::span<const device_span<const T>> values) {
    detail::check_count("init", ks.size(), "with", values.size(), "values");
    std::vector<std::vector<T>> host;
    for (std::size_t i = 0; i < ks.size(); ++i) host.push_back(device_to_host(ks[i], values[i]));
    const std::vector<std::span<const T>> spans(host.begin(), host.end());
    init(ks, std::span<const std::span<const T>>(spans));
  }
  op push(key k, device_span<const T> value, int priority = 0) {
    return push(std::move(k), std::span<const device_span<const T>>(&value, 1), priority);
  }
  /// Several devices' values of one key: summed on the first one's device, pushed once.
  op push(key k, std::initializer_list<device_span<const T>> values, int priority = 0) {
    return push(std::move(k), std::span<const device_span<const T>>(values.begin(), values.size()),
                priority);
  }
  op push(key k, std::span<const device_span<const T>> values, int priority = 0) {
    if (values.empty()) fail(errc::invalid_argument, call_kind::push, k, "no values");
    record* m = find_on_devices(call_kind::push, k, values);
    return submit_device(m, std::vector<device_span<const T>>(values.begin(), values.end()),
                         priority);
  }
  op push(std::span<const key> ks, std::span<const device_span<const T>> values, int priority = 0) {
    auto groups = device_groups(call_kind::push, "with", "values", ks, values);
    auto st = new_state(groups.size());
    for (auto& [m, srcs] : groups) submit_device(m, std::move(srcs), priority, st);
    return op(st);
  }
  op pull(key k, device_span<T> out, int priority = 0) {
    return pull(std::move(k), std::span<const device_span<T>>(&out, 1), priority);
  }
  /// Pulled once into pinned memory, then copied to each output's device.
  op pull(key k, std::initializer_list<device_span<T>> outs, int priority = 0) {
    return pull(std::move(k), std::span<const device_span<T>>(outs.begin(), outs.size()), priority);
  }
  op pull(key k, std::span<const device_span<T>> outs, int priority = 0) {
    if (outs.empty()) fail(errc::invalid_argument, call_kind::pull, k, "no outputs");
    record* m = find_on_devices(call_kind::pull, k, outs);
    return submit_device(m, std::vector<device_span<T>>(outs.begin(), outs.end()), priority);
  }
  op pull(std::span<const key> ks, std::span<const device_span<T>> outs, int priority = 0) {
    auto groups = device_groups(call_kind::pull, "into", "outputs", ks, outs);
    auto st = new_state(groups.size());
    for (auto& [m, o] : groups) submit_device(m, std::move(o), priority, st);
    return op(st);
  }
  /// Push then pull of one key as one op: `out` gets the value after this push.
  op pushpull(key k, device_span<const T> value, device_span<T> out, int priority = 0) {
    record* m =
        find_on_devices(call_kind::pushpull, k, std::span<const device_span<const T>>(&value, 1));
    find_on_devices(call_kind::pushpull, k, std::span<const device_span<T>>(&out, 1));
    return submit(m, priority, [this, m, value, out, priority](auto done) {
      gather_and_push(m, std::span<const device_span<const T>>(&value, 1), priority,
                      [this, m, out, priority, done](std::exception_ptr e) {
                        if (e) return done(e);
                        pull_and_scatter(m, {out}, priority, done);
                      });
    });
  }

  // ---- rows ----------------------------------------------------------------------------------
  op push_rows(key k, std::span<const std::int64_t> rows, std::span<const T> values,
               int priority = 0) {
    record* m = find(call_kind::push_rows, k, std::nullopt);
    check_rows(call_kind::push_rows, *m, rows, values.size());
    return submit(m, priority, [this, m, rows, values, priority](auto done) {
      impl_->reqs.push_rows(*m, rows, values, priority, std::move(done));
    });
  }
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out, int priority = 0) {
    record* m = find(call_kind::pull_rows, k, std::nullopt);
    check_rows(call_kind::pull_rows, *m, rows, out.size());
    return submit(m, priority, [this, m, rows, out, priority](auto done) {
      impl_->reqs.pull_rows(*m, rows, out, priority, std::move(done));
    });
  }

  // ---- placement: which server holds what, and element ranges --------------------------------
  /// (start, length) of key k's elements on server `server` (0 .. num_servers() - 1); a server
  /// that holds none of them gives (the key's size, 0). With partition::even that is BigDL's
  /// chunk `server`. Throws unknown_key (never inited), invalid_argument (no such server).
  std::pair<std::size_t, std::size_t> slice_of(key k, int server) const {
    const record* m = impl_->keys.find(k.id());
    if (!m)
      fail(errc::unknown_key, call_kind::slice_of, k,
           "never inited (server " + std::to_string(server) + ")");
    detail::check_same_name("slice_of", m->k, k);
    if (server < 0 || server >= num_servers())
      fail(errc::invalid_argument, call_kind::slice_of, k,
           "server " + std::to_string(server) + " is out of range (the job has " +
               std::to_string(num_servers()) + " servers)");
    for (const auto& s : m->slices)
      if (s.server == server) return {s.lo, s.hi - s.lo};
    return {m->total, 0};
  }

  /// Pushes elements [offset, offset + values.size()) of the key, sent only to the servers whose
  /// slices the range overlaps. Without an optimizer it stores them (dist_async) or, in
  /// dist_sync, the round's sum over the workers that wrote them; with one they are the gradient
  /// of those elements only. In dist_sync it counts as this worker's push of every slice it
  /// touches: a round of a slice completes once every worker pushed to it (a whole push or a
  /// range), and the elements no worker wrote that round keep their value. Throws
  /// unknown_key, invalid_argument (an empty range), size_mismatch (past the key's end),
  /// naming the key and the range; nothing is sent then.
  op push_range(key k, std::size_t offset, std::span<const T> values, int priority = 0) {
    record* m = find_range(call_kind::push_range, k, offset, values.size());
    return submit(m, priority, [this, m, offset, values, priority](auto done) {
      impl_->reqs.push_range(*m, offset, values, priority, std::move(done));
    });
  }
  /// Pulls elements [offset, offset + out.size()) of the key from the servers holding them.
  /// Throws as push_range.
  op pull_range(key k, std::size_t offset, std::span<T> out, int priority = 0) {
    record* m = find_range(call_kind::pull_range, k, offset, out.size());
    return submit(m, priority, [this, m, offset, out, priority](auto done) {
      impl_->reqs.pull_range(*m, offset, out, priority, std::move(done));
    });
  }

  void wait(key k) {
    impl_->fuse->flush_all();  // fused pushes go now, not after fuse_time
    if (const record* m = impl_->keys.find(k.id())) impl_->eng.wait_slot(m->queue);
  }
  void wait_all() {
    impl_->fuse->flush_all();
    impl_->eng.wait_all();
  }

  // ---- compression ---------------------------------------------------------------------------
  /// This worker's wire compression for every key without its own (init_options::compression),
  /// from its next push or pull on (ops in flight finish first): fp16, bf16, bf16_trunc compress
  /// pushes and pulls, two_bit pushes only (with this worker's residual per key). Servers keep
  /// full precision. Throws invalid_argument, changing nothing, for a type out of range or a
  /// two_bit threshold that is not finite and > 0.
  void set_gradient_compression(const compression& c) {
    detail::check_compression(c, "set_gradient_compression");
    wait_all();
    impl_->reqs.set_compression(c);
  }

  // ---- optimizers ----------------------------------------------------------------------------
  /// Sends the optimizer (registered name and parameters, never code) to every server and
  /// returns once all have it. Not a collective: one worker alone (e.g. rank 0, as MXNet's
  /// scripts do) or every worker may call it. The same type with new parameters keeps every
  /// key's state (a learning-rate schedule is one call per epoch); another type starts fresh.
  /// The type must be registered (KVSTORE_REGISTER_OPTIMIZER) in the servers' program too; the
  /// built-ins sgd, adam, adagrad and add are everywhere.
  template <optim::registered_optimizer O>
  void set_optimizer(const O& o) {
    wait_all();
    auto u = optim::make_updater<T>(o);
    impl_->reqs.set_optimizer(u.name, u.params);
  }
  template <class F>
  requires(!optim::registered_optimizer<std::remove_cvref_t<F>>) void set_optimizer(F&&) {
    static_assert(optim::registered_optimizer<std::remove_cvref_t<F>>,
                  "KVStore<dist>: an optimizer travels to the servers as a registered type and its "
                  "parameters, never as code: define a type with name, num_slots, update and "
                  "serialize, and KVSTORE_REGISTER_OPTIMIZER it");
  }

  /// Scales the learning rate and weight decay of `k`'s updates on the servers (MXNet's lr_mult
  /// and wd_mult): the built-in optimizers use learning_rate * lr_mult and weight_decay * wd_mult
  /// for this key. Applies to ops issued after it (it waits for the key's ops in flight and for
  /// every server holding the key). Throws unknown_key, invalid_argument (not finite).
  void set_key_options(key k, const key_options& o) {
    detail::check_multipliers("set_key_options", k, o.lr_mult, o.wd_mult);
    record* m = find(call_kind::set_key_options, k, std::nullopt);
    wait(k);
    impl_->reqs.set_key_options(*m, o.lr_mult, o.wd_mult);
  }

  /// Gathers every server's optimizer states into one file (written atomically), in the same
  /// format as the local store's, named for the servers' optimizer (whichever worker set it).
  void save_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    std::string optimizer;
    auto states = impl_->reqs.save_states(lookup(), optimizer);
    optim::save_states<T>(path, optimizer, states);
  }

  /// Reads a file saved by save_optimizer_states (local or dist) and gives each server its part.
  /// The file is checked whole before any server changes; a server whose optimizer is not the
  /// one the file was saved for refuses it (invalid_argument, naming both).
  void load_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    std::string optimizer;
    auto loaded = optim::load_states_any<T>(path, optimizer);
    for (auto& [id, ks] : loaded) {
      const record* m = lookup()(id);
      const key shown = ks.name.empty() ? key(static_cast<std::int64_t>(id)) : key(ks.name);
      if (!m)
        fail(errc::unknown_key, call_kind::load_optimizer_states, shown,
             "the file has a state for it, the store has no such key");
      for (auto& sl : ks.st.slots)
        if (sl.size() != m->total)
          fail(errc::size_mismatch, call_kind::load_optimizer_states, shown,
               "saved state does not match the key's size");
    }
    impl_->reqs.load_states(loaded, lookup(), optimizer);
  }

  // ---- the cluster ---------------------------------------------------------------------------
  /// All workers reach it before any leaves. Throws on its deadline or when a worker died,
  /// naming it.
  void barrier() {
    impl_->fuse->flush_all();  // pushes issued before the barrier leave before it
    impl_->reqs.barrier(call_kind::barrier, impl_->opts.barrier_timeout);
  }

  /// MXNet's meaning: how many nodes of the groups in `node_id` (1 scheduler, 2 servers,
  /// 4 workers; sums combine) have not been heard from for timeout_sec. A scheduler that cannot
  /// be asked counts as dead itself.
  int num_dead_node(int node_id, int timeout_sec = 60) {
    try {
      return static_cast<int>(impl_->reqs.dead_count(
          node_id, static_cast<std::uint64_t>(std::max(0, timeout_sec)) * 1000));
    } catch (const error&) {
      // The scheduler cannot answer: it is dead; of the others we only know what we saw.
      return (node_id & detail::group_scheduler) ? 1 : 0;
    }
  }

  /// Runs the servers' command hook (server::on_command) on every server; returns once all ran.
  void send_command_to_servers(int head, std::string_view body) { impl_->reqs.command(head, body); }

  /// Whether the destructor meets the other workers at a barrier first (default true).
  void set_barrier_before_exit(bool on) { impl_->opts.barrier_before_exit = on; }

  /// Leaves the sync group (an addition to MXNet's API, for uneven work): once every op of this
  /// worker is done, the servers complete sync rounds and the scheduler completes barriers
  /// without it. It may still pull (the model keeps training); pushing after leave() is an
  /// error. A worker that dies is treated the same way (dist_options::on_worker_death).
  void leave() {
    wait_all();
    if (impl_->left.exchange(true)) return;
    impl_->reqs.leave();
  }
  /// True after leave().
  bool has_left() const noexcept { return impl_->left.load(); }

  /// Asks every server to write its snapshot now (dist_options::checkpoint_dir); returns once
  /// all are on disk. Throws when a server has no checkpoint directory or cannot write.
  void checkpoint() {
    wait_all();
    impl_->reqs.checkpoint();
  }

 private:
  struct impl {
    explicit impl(const dist_options& o)
        : opts(resolved(o)),
          colocated(start_roles(opts)),
          client(opts, colocated ? colocated->address() : detail::own_server{}),
          reqs(client),
          batch(client),
          fuse(detail::fusion<T>::make(client)),
          eng(opts.threads) {
      eng.set_max_pipeline(opts.pipeline_depth);  // ops of a key on the wire at most
    }
    ~impl() {
      try {
        eng.wait_all();
      } catch (...) {
      }
      if (opts.barrier_before_exit) {
        try {
          reqs.barrier(call_kind::barrier_before_exit, opts.barrier_timeout);
        } catch (const std::exception& e) {
          detail::log_warn("worker", e.what());
        }
      }
      client.leave_job();
      // This process's server goes on serving the others until the job ends.
      if (colocated) colocated->linger(opts.barrier_timeout);
    }
    static dist_options resolved(dist_options o) {
      o.resolve_colocated();
      return o;
    }
    static std::unique_ptr<detail::colocated_roles> start_roles(const dist_options& o) {
      (void)detail::loop_registrar<detail::colocated_loop, T>::registered;
      if (!o.colocated) return nullptr;
      if (!detail::start_colocated)
        throw error(errc::invalid_argument,
                    "kvstore: a colocated worker (KVSTORE_COLOCATED=1) serves a shard, but the "
                    "program was built without the server loop: include <kvstore/kvstore.hpp> "
                    "or <kvstore/colocated.hpp>");
      return detail::start_colocated(o);
    }
    dist_options opts;
    // Declared before the client: destroyed after it, so this worker's connections are closed
    // before its server lingers for the others.
    std::unique_ptr<detail::colocated_roles> colocated;
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
  };

  [[noreturn]] static void fail(errc c, call_kind call, const key& k, const std::string& problem) {
    detail::fail(c, detail::call_name(call), k, problem);
  }

  // The record of a key id, for the state calls.
  typename detail::requests<T>::key_lookup lookup() const {
    return [keys = &impl_->keys](std::uint64_t id) -> const record* { return keys->find(id); };
  }

  record* find(call_kind call, const key& k, std::optional<std::size_t> n) {
    return checked(impl_->keys.find(k.id()), call, k, n);
  }
  // The same with the key table held (key_table::read_lock).
  record* find_locked(call_kind call, const key& k, std::optional<std::size_t> n) {
    return checked(impl_->keys.find_locked(k.id()), call, k, n);
  }
  record* checked(record* m, call_kind call, const key& k, std::optional<std::size_t> n) {
    if (!m) fail(errc::unknown_key, call, k, "never inited");
    if (m->named || k.is_named())  // else both are the same integer: nothing more to read
      detail::check_same_name(detail::call_name(call), m->k, k);
    if (n) check_size(call, *m, *n);
    if (impl_->left && detail::is_push(call))
      fail(errc::invalid_argument, call, k, "this worker left the sync group (leave())");
    return m;
  }
  // The record of a key for a range op, with the range checked: errors name the key and range.
  record* find_range(call_kind call, const key& k, std::size_t offset, std::size_t n) {
    if (!impl_->keys.find(k.id()))
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
    auto [m, fresh] = impl_->keys.add(make_record(k, value, o));
    if (!fresh) {
      detail::check_same_name("init", m->k, k);
      fail(errc::already_inited, call_kind::init, k, "inited twice");
    }
    auto st = send_init(*m, value);
    try {
      op(st).wait();
    } catch (...) {
      impl_->keys.remove(m->k.id());
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
                                          num_servers(), impl_->opts.slice_bytes);
    return std::make_unique<record>(k, value.size(), o.row_length, std::move(slices), o.partition,
                                    o.compression);
  }

  // Sends the init of a key just added; the returned state completes with the answers.
  std::shared_ptr<detail::op_state> send_init(record& m, std::span<const T> value) {
    auto st = new_state(1);
    impl_->reqs.init(m, value, rank() == 0, [st](std::exception_ptr e) { st->complete_part(e); });
    return st;
  }

  // The shared state of a new op of `parts` parts; its wait() spins as the options say, and
  // first sends the pushes fusion holds back.
  std::shared_ptr<detail::op_state> new_state(std::size_t parts) const {
    auto st = detail::make_pooled<detail::op_state>(parts);
    st->spin_us = static_cast<unsigned>(impl_->opts.wait_spin.count());
    st->hurry = impl_->fuse->hook();
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
      impl_->eng.submit_pipelined(m->queue, priority, std::forward<F>(f), std::move(st),
                                  /*may_run_inline=*/true);
    else
      impl_->eng.submit(m->queue, priority, std::forward<F>(f), std::move(st),
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
    const dist_options& o = impl_->opts;
    if (o.pipeline_depth < 2 || o.server_restart_wait.count() > 0 ||
        m.total > std::min(o.chunk_bytes, max_pipelined_bytes) / sizeof(T))
      return false;
    if (pull) return o.sync || !o.staleness;
    return impl_->reqs.travels_plain(m, false);
  }

  // A multi-key call split (client/multi_key.hpp): every key found and checked, the first bad
  // one throwing, naming it, before anything is queued.
  template <class Buf>
  detail::split_call<Buf> split(call_kind call, std::span<const key> ks,
                                std::span<const Buf> bufs) {
    const bool pull = call == call_kind::pull;
    const dist_options& o = impl_->opts;
    const typename detail::multi_key_calls<T>::call_context cx{
        impl_->keys, impl_->reqs, impl_->batch, /*batch_ok=*/!pull || o.sync || !o.staleness,
        /*follow_plans=*/pull || !impl_->left};
    return impl_->calls.split(call, ks, bufs, cx, [&](record* m, std::size_t i) {
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
    if (c.repeats) return submit_batch(impl_->calls.merged(c), priority, st, run);
    for (auto& b : c.small) submit_batch(std::move(b), priority, st, run);
  }

  // One op over all of the batch's keys: run(batch, done) once the engine gives it every key.
  template <class Buf, class Run>
  void submit_batch(std::shared_ptr<detail::batch<Buf>> b, int priority,
                    std::shared_ptr<detail::op_state> st, Run run) {
    std::vector<detail::key_slot*> slots(b->size());
    for (std::size_t j = 0; j < slots.size(); ++j) slots[j] = &b->entries[j].rec->queue;
    impl_->eng.submit(
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
    if (!behind_stream && detail::batches<T>::small(m) && impl_->reqs.travels_plain(m, false) &&
        impl_->fuse->push(m, value, priority, done))
      return true;
    impl_->reqs.push(m, value, priority, std::move(done));
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
          impl_->reqs.push(
              *m, std::span<const T>(*sum), priority,
              [sum, done](std::exception_ptr e) { done(e); }, sum);
        },
        st);
  }

  // ---- values on devices: the dist side (device/dist_bridge.hpp does the device work) -------
  using bridge = detail::dist_device_bridge<T>;

  // Every use of the bridge starts with this assert, so a program without device.hpp gets its
  // message before any other.
  static constexpr bool device_hpp_included = requires { sizeof(bridge); };

  // The store's bridge, made on the first device call.
  bridge& device_bridge() {
    static_assert(device_hpp_included, "device_span values need #include <kvstore/device.hpp>");
    std::call_once(impl_->device_once, [&] { impl_->device = std::make_shared<bridge>(); });
    return *static_cast<bridge*>(impl_->device.get());
  }
  // One device_span of key k (`total` elements), checked at the call.
  template <class P>
  static void check_device(call_kind call, const key& k, std::uint64_t total,
                           const device_span<P>& s) {
    static_assert(device_hpp_included, "device_span values need #include <kvstore/device.hpp>");
    bridge::check(detail::call_name(call), k, total, s);
  }
  std::vector<T> device_to_host(const key& k, const device_span<const T>& v) {
    check_device(call_kind::init, k, v.size, v);
    return device_bridge().to_host("init", k, v);
  }
  // The key's record, every buffer checked against it and its device.
  template <class P>
  record* find_on_devices(call_kind call, const key& k, std::span<const device_span<P>> bufs) {
    record* m = find(call, k, std::nullopt);
    for (auto& b : bufs) check_device(call, m->k, m->total, b);
    return m;
  }
  template <class P>
  std::vector<detail::key_group<record*, device_span<P>>> device_groups(
      call_kind call, std::string_view relation, std::string_view bufs_are, std::span<const key> ks,
      std::span<const device_span<P>> bufs) {
    detail::check_count(detail::call_name(call), ks.size(), relation, bufs.size(), bufs_are);
    return detail::group_by_key<record*>(
        bufs, [&](std::size_t i) { return find_on_devices(call, ks[i], bufs.subspan(i, 1)); },
        [](const record* a, const record* b) { return a == b; });
  }

  // Sums srcs into the key's pinned buffer (issued now; srcs are not read after the call), then
  // pushes it; then(e) once the servers have it.
  void gather_and_push(record* m, std::span<const device_span<const T>> srcs, int priority,
                       detail::engine::done_fn then) {
    auto& b = device_bridge();
    const auto host = b.pinned(m->k.id(), m->total);
    b.gather(detail::call_name(call_kind::push), m->k, srcs, host, priority,
             [this, m, host, priority, then](std::exception_ptr e) {
               if (e) return then(e);
               try {
                 impl_->reqs.push(*m, std::span<const T>(host), priority, then);
               } catch (...) {
                 then(std::current_exception());
               }
             });
  }
  // Pulls the key into its pinned buffer, then copies it to every output; then(e) once they
  // all hold it.
  void pull_and_scatter(record* m, std::vector<device_span<T>> outs, int priority,
                        detail::engine::done_fn then) {
    auto& b = device_bridge();
    const auto host = b.pinned(m->k.id(), m->total);
    impl_->reqs.pull(*m, {host}, priority,
                     [&b, m, host, outs = std::move(outs), priority, then](std::exception_ptr e) {
                       if (e) return then(e);
                       b.scatter(detail::call_name(call_kind::pull), m->k, host,
                                 std::span<const device_span<T>>(outs), priority, then);
                     });
  }
  // One op part per key: a push (P const: gather_and_push) or a pull (pull_and_scatter).
  template <class P>
  op submit_device(record* m, std::vector<device_span<P>> bufs, int priority,
                   std::shared_ptr<detail::op_state> st = nullptr) {
    return submit(
        m, priority,
        [this, m, bufs = std::move(bufs), priority](auto done) {
          if constexpr (std::is_const_v<P>)
            gather_and_push(m, bufs, priority, std::move(done));
          else
            pull_and_scatter(m, bufs, priority, std::move(done));
        },
        st);
  }

  std::unique_ptr<impl> impl_;
};

}  // namespace kvstore
