// KVStore<dist, T>: a worker of a distributed job. Values go to server processes that hold
// shards of the keys (client/partition.hpp), sum a round's pushes of all workers (dist_sync) or
// apply each push on arrival (dist_async), and answer pulls. Constructed in a process whose role
// is server or scheduler (mpirun-style SPMD launches), it runs that role's loop and ends the
// process when the job ends, as MXNet does.
#pragma once

#include <kvstore/client/client.hpp>
#include <kvstore/client/partition.hpp>
#include <kvstore/detail/group.hpp>
#include <kvstore/engine/engine.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>
#include <kvstore/reduce/cpu.hpp>
#include <kvstore/rendezvous/scheduler.hpp>
#include <kvstore/server/server.hpp>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvstore {

namespace detail {

/// What a worker knows of a key: its size, rows, and which server holds which elements.
struct dist_key {
  key k{0};
  std::uint64_t total = 0;
  std::uint64_t row_length = 0;
  std::vector<slice_ref> slices;
  /// Numbers this worker's pushes of the key (1, 2, ...), so a server restored from a snapshot
  /// applies a re-sent push exactly once.
  std::shared_ptr<std::atomic<std::uint64_t>> pushes =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  std::uint64_t rows() const { return row_length ? total / row_length : 0; }
};

/// Completes `done` once `n` parts completed; the first error wins.
struct countdown {
  countdown(std::size_t n, std::function<void(std::exception_ptr)> d)
      : left(n), done(std::move(d)) {}
  std::atomic<std::size_t> left;
  std::mutex m;
  std::exception_ptr first;
  std::function<void(std::exception_ptr)> done;
  void part(std::exception_ptr e) {
    if (e) {
      std::lock_guard lk(m);
      if (!first) first = e;
    }
    if (left.fetch_sub(1) == 1) {
      std::exception_ptr f;
      {
        std::lock_guard lk(m);
        f = first;
      }
      done(f);
    }
  }
};

/// Runs the scheduler or server loop for a process whose role is not worker, then exits it.
[[noreturn]] inline void run_role_and_exit(const dist_options& o) {
  int rc = 0;
  try {
    if (o.role == role::scheduler) {
      scheduler s(o);
      s.run();
    } else {
      server s(o);
      s.run();
    }
  } catch (const std::exception& e) {
    log_warn(role_name(o.role), e.what());
    rc = 1;
  }
  std::exit(rc);
}

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
  static constexpr wire::dtype dtype = wire::dtype_of<T>();

 public:
  using value_type = T;

  /// Options from the environment (dist_options::from_env()).
  KVStore() : KVStore(dist_options::from_env()) {}
  /// Joins the job; throws kvstore::error when the scheduler or a server cannot be reached
  /// within connect_timeout. In a process whose role is server or scheduler this runs that role
  /// and exits the process when the job ends.
  explicit KVStore(const dist_options& o) {
    if (o.role != role::worker) detail::run_role_and_exit(o);
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

  // ---- init ----------------------------------------------------------------------------------
  /// Stores rank 0's value (every worker calls init; each returns once the value is stored).
  /// Throws: init twice, a size that differs between workers, unreachable servers.
  void init(key k, std::span<const T> value) { init_one(std::move(k), value, 0); }
  /// A matrix of value.size() / row_length rows (for push_rows / pull_rows).
  void init(key k, std::span<const T> value, std::size_t row_length) {
    if (row_length == 0) fail(errc::invalid_argument, "init", k, "row_length is 0");
    if (value.size() % row_length != 0)
      fail(errc::size_mismatch, "init", k,
           "size " + std::to_string(value.size()) + " is not a multiple of the row length " +
               std::to_string(row_length));
    init_one(std::move(k), value, row_length);
  }
  void init(std::span<const key> ks, std::span<const std::span<const T>> values) {
    if (ks.size() != values.size())
      throw error(errc::invalid_argument, "kvstore: init of " + std::to_string(ks.size()) +
                                              " keys with " + std::to_string(values.size()) +
                                              " values");
    for (std::size_t i = 0; i < ks.size(); ++i) init_one(ks[i], values[i], 0);
  }

  // ---- push / pull ---------------------------------------------------------------------------
  op push(key k, std::span<const T> value, int priority = 0) {
    auto m = find("push", k, value.size());
    return submit(m, priority,
                  [this, m, value, priority](auto done) { send_push(m, value, priority, done); });
  }
  /// Several devices' values of one key: summed here first, so one message per key leaves.
  op push(key k, std::initializer_list<std::span<const T>> values, int priority = 0) {
    if (values.size() == 0) fail(errc::invalid_argument, "push", k, "no values");
    std::vector<std::span<const T>> srcs(values.begin(), values.end());
    auto m = find("push", k, srcs.front().size());
    for (auto& s : srcs) check_size("push", m, s.size());
    return submit_summed(m, std::move(srcs), priority);
  }
  op push(std::span<const key> ks, std::span<const std::span<const T>> values, int priority = 0) {
    if (ks.size() != values.size())
      throw error(errc::invalid_argument, "kvstore: push of " + std::to_string(ks.size()) +
                                              " keys with " + std::to_string(values.size()) +
                                              " values");
    auto groups = group_by_key("push", ks, values);
    auto st = new_state(groups.size());
    for (auto& [m, srcs] : groups) submit_summed(m, std::move(srcs), priority, st);
    return op(st);
  }

  op pull(key k, std::span<T> out, int priority = 0) {
    auto m = find("pull", k, out.size());
    return submit(m, priority,
                  [this, m, out, priority](auto done) { send_pull(m, {out}, priority, done); });
  }
  /// Each output gets the value.
  op pull(key k, std::initializer_list<std::span<T>> outs, int priority = 0) {
    if (outs.size() == 0) fail(errc::invalid_argument, "pull", k, "no outputs");
    std::vector<std::span<T>> o(outs.begin(), outs.end());
    auto m = find("pull", k, o.front().size());
    for (auto& x : o) check_size("pull", m, x.size());
    return submit(m, priority,
                  [this, m, o, priority](auto done) { send_pull(m, o, priority, done); });
  }
  op pull(std::span<const key> ks, std::span<const std::span<T>> outs, int priority = 0) {
    if (ks.size() != outs.size())
      throw error(errc::invalid_argument, "kvstore: pull of " + std::to_string(ks.size()) +
                                              " keys into " + std::to_string(outs.size()) +
                                              " outputs");
    auto groups = group_by_key("pull", ks, outs);
    auto st = new_state(groups.size());
    for (auto& [m, o] : groups)
      submit(
          m, priority,
          [this, m = m, o = o, priority](auto done) { send_pull(m, o, priority, done); }, st);
    return op(st);
  }

  /// Push then pull of one key as one op: `out` gets the value after this push.
  op pushpull(key k, std::span<const T> value, std::span<T> out, int priority = 0) {
    auto m = find("pushpull", k, value.size());
    check_size("pushpull", m, out.size());
    return submit(m, priority, [this, m, value, out, priority](auto done) {
      send_push(m, value, priority, [this, m, out, priority, done](std::exception_ptr e) {
        if (e) return done(e);
        send_pull(m, {out}, priority, done);
      });
    });
  }

  // ---- rows ----------------------------------------------------------------------------------
  op push_rows(key k, std::span<const std::int64_t> rows, std::span<const T> values,
               int priority = 0) {
    auto m = find("push_rows", k, std::nullopt);
    check_rows("push_rows", m, rows, values.size());
    return submit(m, priority, [this, m, rows, values, priority](auto done) {
      send_push_rows(m, rows, values, priority, done);
    });
  }
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out, int priority = 0) {
    auto m = find("pull_rows", k, std::nullopt);
    check_rows("pull_rows", m, rows, out.size());
    return submit(m, priority, [this, m, rows, out, priority](auto done) {
      send_pull_rows(m, rows, out, priority, done);
    });
  }

  void wait(key k) { impl_->eng.wait_key(k.id()); }
  void wait_all() { impl_->eng.wait_all(); }

  // ---- optimizers ----------------------------------------------------------------------------
  /// Sends the optimizer (registered name and parameters, never code) to every server; a
  /// collective: rank 0 sends, then all workers meet at a barrier. The type must be registered
  /// (KVSTORE_REGISTER_OPTIMIZER) in the servers' program too.
  template <optim::registered_optimizer O>
  void set_optimizer(const O& o) {
    wait_all();
    auto u = optim::make_updater<T>(o);
    if (rank() == 0) {
      wire::meta_writer w;
      w.str(u.name).str(u.params);
      auto meta = w.take();
      to_all_servers("set_optimizer", [&] {
        transport::out_frame f;
        f.h.command = wire::cmd::set_optimizer;
        f.meta = meta;
        return f;
      });
    }
    impl_->opt_name = u.name;
    barrier();
  }
  template <class F>
  requires(!optim::registered_optimizer<std::remove_cvref_t<F>>) void set_optimizer(F&&) {
    static_assert(optim::registered_optimizer<std::remove_cvref_t<F>>,
                  "KVStore<dist>: an optimizer travels to the servers as a registered type and its "
                  "parameters, never as code: define a type with name, num_slots, update and "
                  "serialize, and KVSTORE_REGISTER_OPTIMIZER it");
  }

  /// Gathers every server's optimizer states into one file (written atomically), in the same
  /// format as the local store's.
  void save_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    std::map<std::uint64_t, optim::key_state<T>> states;
    auto keys = snapshot_keys();
    std::mutex m;
    to_all_servers(
        "save_optimizer_states",
        [] {
          transport::out_frame f;
          f.h.command = wire::cmd::save_states;
          return f;
        },
        [&](const wire::header&, std::span<const std::byte> payload) {
          std::lock_guard lk(m);
          for (const auto& e : wire::decode_states(
                   {reinterpret_cast<const char*>(payload.data()), payload.size()})) {
            const std::uint64_t k = e.key, lo = e.lo, hi = e.hi, total = e.total, step = e.step;
            const auto t = e.type;
            const std::uint32_t nslots = e.nslots;
            auto it = keys.find(k);
            if (t != dtype || it == keys.end() || it->second.total != total || hi > total ||
                lo > hi || nslots > optim::max_slots)
              throw error(errc::protocol,
                          "save_optimizer_states: a server sent a state that matches no key");
            auto& ks = states[k];
            ks.name = it->second.k.name();
            ks.st.step = std::max(ks.st.step, step);
            if (ks.st.slots.size() < nslots) ks.st.slots.resize(nslots, std::vector<T>(total, T{}));
            for (std::uint32_t s = 0; s < nslots; ++s) {
              auto raw = e.slot(s);
              std::memcpy(ks.st.slots[s].data() + lo, raw.data(), raw.size());
            }
          }
        });
    optim::save_states<T>(path, impl_->opt_name, states);
  }

  /// Reads a file saved by save_optimizer_states (local or dist) and gives each server its part.
  /// The file is checked whole before any server changes.
  void load_optimizer_states(const std::filesystem::path& path) {
    wait_all();
    auto loaded = optim::load_states<T>(path, impl_->opt_name);
    auto keys = snapshot_keys();
    std::vector<std::string> parts(static_cast<std::size_t>(num_servers()));
    for (auto& [id, ks] : loaded) {
      auto it = keys.find(id);
      const key shown = ks.name.empty() ? key(static_cast<std::int64_t>(id)) : key(ks.name);
      if (it == keys.end())
        fail(errc::unknown_key, "load_optimizer_states", shown,
             "the file has a state for it, the store has no such key");
      for (auto& sl : ks.st.slots)
        if (sl.size() != it->second.total)
          fail(errc::size_mismatch, "load_optimizer_states", shown,
               "saved state does not match the key's size");
      for (auto& s : it->second.slices) {
        wire::meta_writer w;
        w.u64(id)
            .u32(static_cast<std::uint32_t>(dtype))
            .u64(s.lo)
            .u64(s.hi)
            .u64(it->second.total)
            .u64(ks.st.step)
            .u32(static_cast<std::uint32_t>(ks.st.slots.size()));
        auto& p = parts[static_cast<std::size_t>(s.server)];
        p += w.take();
        for (auto& sl : ks.st.slots)
          p.append(reinterpret_cast<const char*>(sl.data() + s.lo), (s.hi - s.lo) * sizeof(T));
      }
    }
    auto bufs = std::make_shared<std::vector<std::string>>(std::move(parts));
    int s = 0;
    to_all_servers("load_optimizer_states", [&] {
      transport::out_frame f;
      f.h.command = wire::cmd::load_states;
      auto& b = (*bufs)[static_cast<std::size_t>(s++)];
      f.payload = reinterpret_cast<const std::byte*>(b.data());
      f.payload_len = b.size();
      f.keep = bufs;
      return f;
    });
  }

  // ---- the cluster ---------------------------------------------------------------------------
  /// All workers reach it before any leaves. Throws on its deadline or when a worker died,
  /// naming it.
  void barrier() {
    transport::out_frame f;
    f.h.command = wire::cmd::barrier;
    detail::worker_client::request r;
    r.what = "barrier";
    r.timeout = impl_->opts.barrier_timeout;
    impl_->client.call(detail::worker_client::to_scheduler,
                       detail::worker_client::single(std::move(f)), std::move(r));
  }

  /// MXNet's meaning: how many nodes of the groups in `node_id` (1 scheduler, 2 servers,
  /// 4 workers; sums combine) have not been heard from for timeout_sec. A scheduler that cannot
  /// be asked counts as dead itself.
  int num_dead_node(int node_id, int timeout_sec = 60) {
    transport::out_frame f;
    f.h.command = wire::cmd::dead_count;
    f.h.key = static_cast<std::uint64_t>(node_id);
    f.h.total = static_cast<std::uint64_t>(std::max(0, timeout_sec)) * 1000;
    std::uint64_t n = 0;
    detail::worker_client::request r;
    r.what = "num_dead_node";
    r.timeout = std::chrono::milliseconds(10'000);
    r.on_response = [&n](const wire::header& h, std::span<const std::byte>) { n = h.aux; };
    try {
      impl_->client.call(detail::worker_client::to_scheduler,
                         detail::worker_client::single(std::move(f)), std::move(r));
    } catch (const error&) {
      // The scheduler cannot answer: it is dead; of the others we only know what we saw.
      return (node_id & detail::group_scheduler) ? 1 : 0;
    }
    return static_cast<int>(n);
  }

  /// Runs the servers' command hook (server::on_command) on every server; returns once all ran.
  void send_command_to_servers(int head, std::string_view body) {
    std::string b(body);
    to_all_servers("send_command_to_servers", [&] {
      transport::out_frame f;
      f.h.command = wire::cmd::command;
      f.h.key = static_cast<std::uint64_t>(static_cast<std::int64_t>(head));
      f.meta = b;
      return f;
    });
  }

  /// Whether the destructor meets the other workers at a barrier first (default true).
  void set_barrier_before_exit(bool on) { impl_->opts.barrier_before_exit = on; }

  /// Leaves the sync group (an addition to MXNet's API, for uneven work): once every op of this
  /// worker is done, the servers complete sync rounds and the scheduler completes barriers
  /// without it. It may still pull (the model keeps training); pushing after leave() is an
  /// error. A worker that dies is treated the same way (dist_options::on_worker_death).
  void leave() {
    wait_all();
    if (impl_->left.exchange(true)) return;
    to_all_servers("leave", [] {
      transport::out_frame f;
      f.h.command = wire::cmd::leave;
      return f;
    });
    transport::out_frame f;
    f.h.command = wire::cmd::leave;
    detail::worker_client::request r;
    r.what = "leave";
    impl_->client.call(detail::worker_client::to_scheduler,
                       detail::worker_client::single(std::move(f)), std::move(r));
  }
  /// True after leave().
  bool has_left() const noexcept { return impl_->left.load(); }

  /// Asks every server to write its snapshot now (dist_options::checkpoint_dir); returns once
  /// all are on disk. Throws when a server has no checkpoint directory or cannot write.
  void checkpoint() {
    wait_all();
    to_all_servers("checkpoint", [] {
      transport::out_frame f;
      f.h.command = wire::cmd::checkpoint;
      return f;
    });
  }

 private:
  struct impl {
    explicit impl(const dist_options& o) : opts(o), client(o), eng(o.threads) {}
    ~impl() {
      try {
        eng.wait_all();
      } catch (...) {
      }
      if (opts.barrier_before_exit) {
        try {
          transport::out_frame f;
          f.h.command = wire::cmd::barrier;
          detail::worker_client::request r;
          r.what = "barrier before exit";
          r.timeout = opts.barrier_timeout;
          client.call(detail::worker_client::to_scheduler,
                      detail::worker_client::single(std::move(f)), std::move(r));
        } catch (const std::exception& e) {
          detail::log_warn("worker", e.what());
        }
      }
      client.leave_job();
    }
    dist_options opts;
    detail::worker_client client;
    detail::engine eng;  // destroyed before the client: no op outlives the network
    std::shared_mutex m;
    std::unordered_map<std::uint64_t, detail::dist_key> keys;
    std::string opt_name;
    std::atomic<bool> left{false};
  };

  [[noreturn]] static void fail(errc c, std::string_view call, const key& k,
                                const std::string& problem) {
    throw error(c, "kvstore: " + std::string(call) + " of key " + k.str() + ": " + problem);
  }

  // The buffers of a multi-key call grouped by key, in first-appearance order: a key named twice
  // gets both buffers in one group (summed for a push, each filled for a pull).
  template <class Span>
  std::vector<detail::key_group<detail::dist_key, Span>> group_by_key(std::string_view call,
                                                                      std::span<const key> ks,
                                                                      std::span<const Span> bufs) {
    return detail::group_by_key<detail::dist_key>(
        bufs, [&](std::size_t i) { return find(call, ks[i], bufs[i].size()); },
        [](const detail::dist_key& a, const detail::dist_key& b) { return a.k.id() == b.k.id(); });
  }

  std::unordered_map<std::uint64_t, detail::dist_key> snapshot_keys() {
    std::shared_lock lk(impl_->m);
    return impl_->keys;
  }

  detail::dist_key find(std::string_view call, const key& k, std::optional<std::size_t> n) {
    detail::dist_key m;
    {
      std::shared_lock lk(impl_->m);
      auto it = impl_->keys.find(k.id());
      if (it == impl_->keys.end()) fail(errc::unknown_key, call, k, "never inited");
      m = it->second;
    }
    if (m.k.is_named() != k.is_named() || m.k.name() != k.name())
      fail(errc::invalid_argument, call, k,
           "its id " + std::to_string(k.id()) + " is already taken by key " + m.k.str());
    if (n) check_size(call, m, *n);
    if (impl_->left && call.starts_with("push"))
      fail(errc::invalid_argument, call, k, "this worker left the sync group (leave())");
    return m;
  }
  static void check_size(std::string_view call, const detail::dist_key& m, std::size_t n) {
    if (n != m.total)
      fail(errc::size_mismatch, call, m.k,
           "size " + std::to_string(n) + " does not match the key's size " +
               std::to_string(m.total));
  }
  static void check_rows(std::string_view call, const detail::dist_key& m,
                         std::span<const std::int64_t> rows, std::size_t n) {
    if (!m.row_length)
      fail(errc::not_a_matrix, call, m.k, "it was inited without a row length, so it has no rows");
    const auto nrows = static_cast<std::int64_t>(m.rows());
    for (auto r : rows)
      if (r < 0 || r >= nrows)
        fail(errc::row_out_of_range, call, m.k,
             "row " + std::to_string(r) + " is out of range (the key has " + std::to_string(nrows) +
                 " rows)");
    if (n != rows.size() * m.row_length)
      fail(errc::invalid_argument, call, m.k,
           std::to_string(rows.size()) + " rows of " + std::to_string(m.row_length) + " need " +
               std::to_string(rows.size() * m.row_length) + " elements, given " +
               std::to_string(n));
  }

  void init_one(key k, std::span<const T> value, std::uint64_t row_length) {
    if (value.empty()) fail(errc::invalid_argument, "init", k, "an empty value");
    detail::dist_key m;
    m.k = k;
    m.total = value.size();
    m.row_length = row_length;
    m.slices = detail::partition(k.id(), m.total, row_length, sizeof(T), num_servers(),
                                 impl_->opts.slice_bytes);
    {
      std::unique_lock lk(impl_->m);
      auto it = impl_->keys.find(k.id());
      if (it != impl_->keys.end()) {
        if (it->second.k.name() != k.name())
          fail(errc::invalid_argument, "init", k,
               "its id is already taken by key " + it->second.k.str());
        fail(errc::already_inited, "init", k, "inited twice");
      }
      impl_->keys.emplace(k.id(), m);
    }
    const bool data = rank() == 0;
    const std::size_t chunk = chunk_elems();
    auto st = new_state(m.slices.size());
    for (auto& s : m.slices) {
      std::vector<transport::out_frame> frames;
      wire::meta_writer w;
      w.u64(s.lo).u64(s.hi);
      const std::string meta = w.take();
      auto frame = [&](std::uint64_t off, std::uint64_t n, bool last) {
        transport::out_frame f;
        f.h.command = wire::cmd::init;
        f.h.key = k.id();
        f.h.total = m.total;
        f.h.aux = row_length;
        f.h.type = dtype;
        f.h.offset = off;
        f.h.flags = (last ? wire::flag_last : 0u) | (data ? wire::flag_has_data : 0u);
        f.meta = meta;
        if (data) {
          f.payload = reinterpret_cast<const std::byte*>(value.data() + off);
          f.payload_len = n * sizeof(T);
        }
        frames.push_back(std::move(f));
      };
      if (data) {
        for (std::uint64_t off = s.lo; off < s.hi; off += chunk)
          frame(off, std::min<std::uint64_t>(chunk, s.hi - off), off + chunk >= s.hi);
      } else {
        frame(s.lo, 0, true);
      }
      detail::worker_client::request r;
      r.what = "init of key " + k.str();
      r.timeout = impl_->opts.connect_timeout + impl_->opts.request_timeout;
      r.done = [st](std::exception_ptr e) { st->complete_part(e); };
      impl_->client.send(s.server, std::move(frames), std::move(r));
    }
    try {
      op(st).wait();
    } catch (...) {
      std::unique_lock lk(impl_->m);
      impl_->keys.erase(k.id());
      throw;
    }
  }

  // The shared state of a new op of `parts` parts; its wait() spins as the options say.
  std::shared_ptr<detail::op_state> new_state(std::size_t parts) const {
    auto st = std::make_shared<detail::op_state>(parts);
    st->spin_us = static_cast<unsigned>(impl_->opts.wait_spin.count());
    return st;
  }

  std::size_t chunk_elems() const {
    return std::max<std::size_t>(1, impl_->opts.chunk_bytes / sizeof(T));
  }

  template <class F>
  op submit(const detail::dist_key& m, int priority, F&& f,
            std::shared_ptr<detail::op_state> st = nullptr) {
    const bool fresh = !st;
    if (!st) st = new_state(1);
    impl_->eng.submit(
        m.k.id(), priority,
        [f = std::forward<F>(f)](detail::engine::done_fn done) { f(std::move(done)); }, st,
        /*may_run_inline=*/true);
    return fresh ? op(st) : op();
  }

  op submit_summed(const detail::dist_key& m, std::vector<std::span<const T>> srcs, int priority,
                   std::shared_ptr<detail::op_state> st = nullptr) {
    if (srcs.size() == 1) {
      auto v = srcs.front();
      return submit(
          m, priority, [this, m, v, priority](auto done) { send_push(m, v, priority, done); }, st);
    }
    return submit(
        m, priority,
        [this, m, srcs = std::move(srcs), priority](auto done) {
          auto sum = std::make_shared<std::vector<T>>(m.total);
          reduce::sum_into<T>(std::span<T>(*sum), std::span<const std::span<const T>>(srcs));
          send_push(
              m, std::span<const T>(*sum), priority, [sum, done](std::exception_ptr e) { done(e); },
              sum);
        },
        st);
  }

  template <class Done>
  void send_push(const detail::dist_key& m, std::span<const T> value, int priority, Done done,
                 std::shared_ptr<const void> keep = nullptr) {
    auto cd = std::make_shared<detail::countdown>(m.slices.size(), std::move(done));
    const std::size_t chunk = chunk_elems();
    const std::uint64_t seq = ++*m.pushes;
    for (auto& s : m.slices) {
      std::vector<transport::out_frame> frames;
      for (std::uint64_t off = s.lo; off < s.hi; off += chunk) {
        const std::uint64_t n = std::min<std::uint64_t>(chunk, s.hi - off);
        transport::out_frame f;
        f.h.command = wire::cmd::push;
        f.h.aux = seq;
        f.h.key = m.k.id();
        f.h.total = m.total;
        f.h.type = dtype;
        f.h.offset = off;
        f.h.priority = priority;
        f.h.flags = off + n >= s.hi ? wire::flag_last : 0u;
        f.payload = reinterpret_cast<const std::byte*>(value.data() + off);
        f.payload_len = n * sizeof(T);
        f.keep = keep;
        frames.push_back(std::move(f));
      }
      detail::worker_client::request r;
      r.what = "push of key " + m.k.str();
      r.done = [cd](std::exception_ptr e) { cd->part(e); };
      impl_->client.send(s.server, std::move(frames), std::move(r));
    }
  }

  template <class Done>
  void send_pull(const detail::dist_key& m, std::vector<std::span<T>> outs, int priority,
                 Done done) {
    auto first = outs.front();
    auto cd =
        std::make_shared<detail::countdown>(m.slices.size(), [outs, done](std::exception_ptr e) {
          if (!e)
            for (std::size_t i = 1; i < outs.size(); ++i)
              std::copy(outs[0].begin(), outs[0].end(), outs[i].begin());
          done(e);
        });
    for (auto& s : m.slices) {
      transport::out_frame f;
      f.h.command = wire::cmd::pull;
      f.h.key = m.k.id();
      f.h.total = m.total;
      f.h.type = dtype;
      f.h.offset = s.lo;
      f.h.priority = priority;
      detail::worker_client::request r;
      r.what = "pull of key " + m.k.str();
      r.out = reinterpret_cast<std::byte*>(first.data());
      r.out_bytes = first.size() * sizeof(T);
      r.elem = sizeof(T);
      r.done = [cd](std::exception_ptr e) { cd->part(e); };
      impl_->client.send(s.server, detail::worker_client::single(std::move(f)), std::move(r));
    }
  }

  // Rows of slice `s` of a matrix key.
  static bool owns_row(const detail::slice_ref& s, std::uint64_t rl, std::int64_t row) {
    const auto r = static_cast<std::uint64_t>(row);
    return r * rl >= s.lo && r * rl < s.hi;
  }

  template <class Done>
  void send_push_rows(const detail::dist_key& m, std::span<const std::int64_t> rows,
                      std::span<const T> values, int priority, Done done) {
    auto cd = std::make_shared<detail::countdown>(m.slices.size(), std::move(done));
    const std::uint64_t rl = m.row_length;
    const std::size_t per = std::max<std::size_t>(1, impl_->opts.chunk_bytes / (rl * sizeof(T)));
    const std::uint64_t seq = ++*m.pushes;
    for (auto& s : m.slices) {
      // This server's rows and their values, gathered (every server of the key gets a message,
      // possibly empty, so a sync round counts this worker everywhere).
      auto ids = std::make_shared<std::vector<std::int64_t>>();
      auto vals = std::make_shared<std::vector<T>>();
      for (std::size_t i = 0; i < rows.size(); ++i)
        if (owns_row(s, rl, rows[i])) {
          ids->push_back(rows[i]);
          vals->insert(vals->end(), values.begin() + static_cast<std::ptrdiff_t>(i * rl),
                       values.begin() + static_cast<std::ptrdiff_t>((i + 1) * rl));
        }
      std::vector<transport::out_frame> frames;
      std::size_t i = 0;
      do {
        const std::size_t n = std::min(per, ids->size() - i);
        transport::out_frame f;
        f.h.command = wire::cmd::push_rows;
        f.h.aux = seq;
        f.h.key = m.k.id();
        f.h.total = m.total;
        f.h.type = dtype;
        f.h.priority = priority;
        f.h.flags = i + n >= ids->size() ? wire::flag_last : 0u;
        f.meta = wire::encode_rows(ids->data() + i, n);
        f.payload = reinterpret_cast<const std::byte*>(vals->data() + i * rl);
        f.payload_len = n * rl * sizeof(T);
        f.keep = vals;
        frames.push_back(std::move(f));
        i += n;
      } while (i < ids->size());
      detail::worker_client::request r;
      r.what = "push_rows of key " + m.k.str();
      r.done = [cd](std::exception_ptr e) { cd->part(e); };
      impl_->client.send(s.server, std::move(frames), std::move(r));
    }
  }

  template <class Done>
  void send_pull_rows(const detail::dist_key& m, std::span<const std::int64_t> rows,
                      std::span<T> out, int priority, Done done) {
    const std::uint64_t rl = m.row_length;
    std::vector<std::pair<const detail::slice_ref*, std::shared_ptr<std::vector<std::size_t>>>>
        asks;
    for (auto& s : m.slices) {
      auto pos = std::make_shared<std::vector<std::size_t>>();
      for (std::size_t i = 0; i < rows.size(); ++i)
        if (owns_row(s, rl, rows[i])) pos->push_back(i);
      if (!pos->empty()) asks.emplace_back(&s, pos);
    }
    if (asks.empty()) return done(nullptr);
    auto cd = std::make_shared<detail::countdown>(asks.size(), std::move(done));
    for (auto& ask : asks) {
      const detail::slice_ref* s = ask.first;
      auto pos = ask.second;
      std::vector<std::int64_t> ids;
      for (auto p : *pos) ids.push_back(rows[p]);
      transport::out_frame f;
      f.h.command = wire::cmd::pull_rows;
      f.h.key = m.k.id();
      f.h.total = m.total;
      f.h.type = dtype;
      f.h.priority = priority;
      f.meta = wire::encode_rows(ids.data(), ids.size());
      detail::worker_client::request r;
      r.what = "pull_rows of key " + m.k.str();
      r.on_data = [pos, out, rl](const wire::header& h, std::span<const std::byte> payload) {
        const std::size_t n = payload.size() / (rl * sizeof(T));
        if (h.offset > pos->size() || n > pos->size() - h.offset ||
            payload.size() != n * rl * sizeof(T))
          throw error(errc::protocol, "pull_rows answer does not match the request");
        const T* src = reinterpret_cast<const T*>(payload.data());
        for (std::size_t j = 0; j < n; ++j)
          std::memcpy(out.data() + (*pos)[h.offset + j] * rl, src + j * rl, rl * sizeof(T));
      };
      r.done = [cd](std::exception_ptr e) { cd->part(e); };
      impl_->client.send(s->server, detail::worker_client::single(std::move(f)), std::move(r));
    }
  }

  // Sends make() to every server and waits for all answers; on_response sees each answer.
  template <class Make>
  void to_all_servers(
      std::string_view what, Make&& make,
      std::function<void(const wire::header&, std::span<const std::byte>)> on_response = {}) {
    auto st = new_state(static_cast<std::size_t>(num_servers()));
    for (int s = 0; s < num_servers(); ++s) {
      detail::worker_client::request r;
      r.what = std::string(what) + " on " + detail::node_name(detail::server_id(s));
      r.on_response = on_response;
      r.done = [st](std::exception_ptr e) { st->complete_part(e); };
      impl_->client.send(s, detail::worker_client::single(make()), std::move(r));
    }
    op(st).wait();
  }

  std::unique_ptr<impl> impl_;
};

}  // namespace kvstore
