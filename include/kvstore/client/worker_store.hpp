// detail::worker_store<T>: what KVStore<dist, T> does behind its public calls: each call's checks
// and how it becomes requests over the worker's parts (client/worker_core.hpp). The requests
// themselves are client/requests.hpp's; the connections client/client.hpp's. dist.hpp's public
// type holds one of these by pointer, so a program built with KVSTORE_SEPARATE_COMPILATION never
// parses this file.
#pragma once

#include <kvstore/client/batch.hpp>
#include <kvstore/client/call.hpp>
#include <kvstore/client/key_record.hpp>
#include <kvstore/client/worker_core.hpp>
#include <kvstore/detail/checks.hpp>
#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/op.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// The worker behind KVStore<dist, T> (see decl/dist.hpp for the contract of each call): every
/// call's body, over the parts of worker_core.
template <class T>
class worker_store : public worker_core<T> {
  using base = worker_core<T>;

 public:
  using base::base;
  using base::batch;
  using base::calls;
  using base::check_rows;
  using base::check_size;
  using base::checked;
  using base::client;
  using base::colocated;
  using base::device;
  using base::device_once;
  using base::eng;
  using base::fail;
  using base::find;
  using base::find_locked;
  using base::find_range;
  using base::fuse;
  using base::init_one;
  using base::keys;
  using base::left;
  using base::lookup;
  using base::make_record;
  using base::new_state;
  using base::num_servers;
  using base::num_workers;
  using base::opts;
  using base::pipelines;
  using base::push_one;
  using base::rank;
  using base::reqs;
  using base::roles;
  using base::send_init;
  using base::split;
  using base::submit;
  using base::submit_batch;
  using base::submit_small;
  using base::submit_summed;
  using base::type;
  using typename base::call_kind;
  using typename base::record;

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
      auto lk = keys.read_lock();
      for (std::size_t i = 0; i < ks.size(); ++i) {
        if (values[i].empty())
          fail(errc::invalid_argument, call_kind::init, ks[i], "an empty value");
        if (const record* m = keys.find_locked(ks[i].id())) {
          detail::check_same_name("init", m->k, ks[i]);
          fail(errc::already_inited, call_kind::init, ks[i], "inited twice");
        }
      }
    }
    // The records, added under one lock (a key named twice is found there, its first record
    // marked by this call); the small keys batched, the others one by one.
    const std::uint64_t call = calls.next_call();
    std::vector<std::unique_ptr<record>> made;
    made.reserve(ks.size());
    for (std::size_t i = 0; i < ks.size(); ++i) {
      made.push_back(make_record(ks[i], values[i], {}));
      made.back()->batch_call = call;
    }
    std::vector<record*> added;
    added.reserve(ks.size());
    if (const std::size_t taken = keys.add_all(made, added); taken != ks.size()) {
      const record* other = keys.find(ks[taken].id());
      const bool twice = other && other->batch_call == call;
      for (record* m : added) keys.remove(m->k.id());
      if (twice) fail(errc::already_inited, call_kind::init, ks[taken], "named twice in one init");
      if (other) detail::check_same_name("init", other->k, ks[taken]);
      fail(errc::already_inited, call_kind::init, ks[taken], "inited twice");
    }
    detail::batch<std::span<const T>> small(calls.next_call(), ks.size());
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
      batch.init(small, rank() == 0, failed, [st](std::exception_ptr e) { st->complete_part(e); });
      try {
        op(st).wait();
      } catch (...) {
        first = std::current_exception();
        for (std::size_t j = 0; j < small.size(); ++j)
          if (failed[j]) keys.remove(small.entries[j].rec->k.id());
      }
    }
    for (auto& [m, st] : sent) {
      try {
        op(st).wait();
      } catch (...) {
        keys.remove(m->k.id());
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
      batch.push(*b, priority, std::move(done));
    });
    return op(st);
  }

  op pull(key k, std::span<T> out, int priority = 0) {
    record* m = find(call_kind::pull, k, out.size());
    return submit(
        m, priority,
        [this, m, out, priority](auto done) { reqs.pull(*m, {out}, priority, std::move(done)); },
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
        [this, m, o, priority](auto done) { reqs.pull(*m, o, priority, std::move(done)); }, nullptr,
        pipelines(*m, true));
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
            reqs.pull(*m, o, priority, std::move(done));
          },
          st);
    submit_small(call, priority, st, [this, priority](auto b, auto done) {
      batch.pull(std::move(b), priority, std::move(done));
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
      reqs.pull(*m, {out}, o.priority, std::move(done), o.min_version);
    });
  }

  /// The version of `k` on its servers: sync rounds completed (dist_sync) or pushes applied
  /// (dist_async), each push or round counted once even across a server restart. A key sliced
  /// over several servers has the least of its slices' versions. Asked after this worker's
  /// earlier ops on `k` are done, as a pull is. Throws unknown_key for a key never inited.
  std::uint64_t version(key k) {
    record* m = find(call_kind::version, k, std::nullopt);
    auto v = std::make_shared<std::uint64_t>(0);
    submit(m, 0, [this, m, v](auto done) { reqs.version(*m, v, std::move(done)); }).wait();
    return *v;
  }

  /// Push then pull of one key as one op: `out` gets the value after this push.
  op pushpull(key k, std::span<const T> value, std::span<T> out, int priority = 0) {
    record* m = find(call_kind::pushpull, k, value.size());
    check_size(call_kind::pushpull, *m, out.size());
    return submit(m, priority, [this, m, value, out, priority](auto done) {
      reqs.push(*m, value, priority, [this, m, out, priority, done](std::exception_ptr e) {
        if (e) return done(e);
        reqs.pull(*m, {out}, priority, done);
      });
    });
  }

  // ---- rows ----------------------------------------------------------------------------------
  op push_rows(key k, std::span<const std::int64_t> rows, std::span<const T> values,
               int priority = 0) {
    record* m = find(call_kind::push_rows, k, std::nullopt);
    check_rows(call_kind::push_rows, *m, rows, values.size());
    return submit(m, priority, [this, m, rows, values, priority](auto done) {
      reqs.push_rows(*m, rows, values, priority, std::move(done));
    });
  }
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out, int priority = 0) {
    record* m = find(call_kind::pull_rows, k, std::nullopt);
    check_rows(call_kind::pull_rows, *m, rows, out.size());
    return submit(m, priority, [this, m, rows, out, priority](auto done) {
      reqs.pull_rows(*m, rows, out, priority, std::move(done));
    });
  }

  // ---- placement: which server holds what, and element ranges --------------------------------
  /// (start, length) of key k's elements on server `server` (0 .. num_servers() - 1); a server
  /// that holds none of them gives (the key's size, 0). With partition::even that is BigDL's
  /// chunk `server`. Throws unknown_key (never inited), invalid_argument (no such server).
  std::pair<std::size_t, std::size_t> slice_of(key k, int server) const {
    const record* m = keys.find(k.id());
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
      reqs.push_range(*m, offset, values, priority, std::move(done));
    });
  }
  /// Pulls elements [offset, offset + out.size()) of the key from the servers holding them.
  /// Throws as push_range.
  op pull_range(key k, std::size_t offset, std::span<T> out, int priority = 0) {
    record* m = find_range(call_kind::pull_range, k, offset, out.size());
    return submit(m, priority, [this, m, offset, out, priority](auto done) {
      reqs.pull_range(*m, offset, out, priority, std::move(done));
    });
  }

  void wait(key k) {
    fuse->flush_all();  // fused pushes go now, not after fuse_time
    if (const record* m = keys.find(k.id())) eng.wait_slot(m->queue);
  }
  void wait_all() {
    fuse->flush_all();
    eng.wait_all();
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
    reqs.set_compression(c);
  }

  // ---- optimizers ----------------------------------------------------------------------------
  /// Sends the optimizer (registered name and parameters, never code) to every server and
  /// returns once all have it. Not a collective: one worker alone (e.g. rank 0, as MXNet's
  /// scripts do) or every worker may call it. The same type with new parameters keeps every
  /// key's state (a learning-rate schedule is one call per epoch); another type starts fresh.
  /// The type must be registered (KVSTORE_REGISTER_OPTIMIZER) in the servers' program too; the
  /// built-ins sgd, adam, adagrad and add are everywhere.
  /// The optimizer by its registered name and serialized parameters (optim::serialize_params).
  void set_optimizer(const std::string& name, const std::string& params) {
    wait_all();
    reqs.set_optimizer(name, params);
  }

  /// Scales the learning rate and weight decay of `k`'s updates on the servers (MXNet's lr_mult
  /// and wd_mult): the built-in optimizers use learning_rate * lr_mult and weight_decay * wd_mult
  /// for this key. Applies to ops issued after it (it waits for the key's ops in flight and for
  /// every server holding the key). Throws unknown_key, invalid_argument (not finite).
  void set_key_options(key k, const key_options& o) {
    detail::check_multipliers("set_key_options", k, o.lr_mult, o.wd_mult);
    record* m = find(call_kind::set_key_options, k, std::nullopt);
    wait(k);
    reqs.set_key_options(*m, o.lr_mult, o.wd_mult);
  }

  /// Gathers every server's optimizer states into one file (written atomically), in the same
  /// format as the local store's, named for the servers' optimizer (whichever worker set it).
  void save_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    std::string optimizer;
    auto states = reqs.save_states(lookup(), optimizer);
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
    reqs.load_states(loaded, lookup(), optimizer);
  }

  // ---- the cluster ---------------------------------------------------------------------------
  /// All workers reach it before any leaves. Throws on its deadline or when a worker died,
  /// naming it.
  void barrier() {
    fuse->flush_all();  // pushes issued before the barrier leave before it
    reqs.barrier(call_kind::barrier, opts.barrier_timeout);
  }

  /// MXNet's meaning: how many nodes of the groups in `node_id` (1 scheduler, 2 servers,
  /// 4 workers; sums combine) have not been heard from for timeout_sec. A scheduler that cannot
  /// be asked counts as dead itself.
  int num_dead_node(int node_id, int timeout_sec = 60) {
    try {
      return static_cast<int>(
          reqs.dead_count(node_id, static_cast<std::uint64_t>(std::max(0, timeout_sec)) * 1000));
    } catch (const error&) {
      // The scheduler cannot answer: it is dead; of the others we only know what we saw.
      return (node_id & detail::group_scheduler) ? 1 : 0;
    }
  }

  /// Runs the servers' command hook (server::on_command) on every server; returns once all ran.
  void send_command_to_servers(int head, std::string_view body) { reqs.command(head, body); }

  /// Whether the destructor meets the other workers at a barrier first (default true).
  void set_barrier_before_exit(bool on) { opts.barrier_before_exit = on; }

  /// Leaves the sync group (an addition to MXNet's API, for uneven work): once every op of this
  /// worker is done, the servers complete sync rounds and the scheduler completes barriers
  /// without it. It may still pull (the model keeps training); pushing after leave() is an
  /// error. A worker that dies is treated the same way (dist_options::on_worker_death).
  void leave() {
    wait_all();
    if (left.exchange(true)) return;
    reqs.leave();
  }
  /// True after leave().
  bool has_left() const noexcept { return left.load(); }

  /// Asks every server to write its snapshot now (dist_options::checkpoint_dir); returns once
  /// all are on disk. Throws when a server has no checkpoint directory or cannot write.
  void checkpoint() {
    wait_all();
    reqs.checkpoint();
  }
};

}  // namespace kvstore::detail
