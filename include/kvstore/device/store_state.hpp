// The shared state of one device store: its devices (two streams each, bounded staging, bytes
// placed there), which devices' kernels read which devices' memory, the keys and where new ones
// go, the optimizer, the completion queue and the engine; and submit(), which queues one part of
// an op on a key, issues its work on the owner's stream and completes the part when the stream
// gets there.
#pragma once

#include <kvstore/detail/checks.hpp>
#include <kvstore/device/buffer.hpp>
#include <kvstore/device/checks.hpp>
#include <kvstore/device/completion.hpp>
#include <kvstore/device/key_state.hpp>
#include <kvstore/device/optimizer.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/engine/engine.hpp>
#include <kvstore/error.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// One device of the store: its streams (normal and high priority) and, per stream, bounded
/// staging memory for inputs its kernels cannot read directly.
struct device_ctx {
  int dev = 0;
  rt::stream_t streams[2] = {nullptr, nullptr};
  std::mutex staging_m[2];
  void* staging[2] = {nullptr, nullptr};
  std::size_t staging_bytes[2] = {0, 0};
  std::size_t bytes_owned = 0;  ///< values placed here (balanced placement)

  explicit device_ctx(int d) : dev(d) {
    const auto [greatest, least] = rt::priority_range(d);
    streams[0] = rt::stream_create(d, least);
    streams[1] = rt::stream_create(d, greatest);
  }
  device_ctx(const device_ctx&) = delete;
  device_ctx& operator=(const device_ctx&) = delete;
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
  using entry = device_entry<T>;
  /// A key to add, with its first value (checked by the caller).
  struct init_item {
    key k;
    dev_ref<const T> value;
    std::size_t row_length;
  };

  /// Throws invalid_argument (no devices, a repeated one, one that does not exist) or
  /// device_error (a stream could not be made).
  explicit device_impl(const device_options& o) : opts(o), eng(o.threads ? o.threads : 1) {
    auto& ds = opts.devices;
    if (ds.empty()) throw error(errc::invalid_argument, "kvstore: device store with no devices");
    for (std::size_t i = 0; i < ds.size(); ++i) {
      if (!rt::device_exists(ds[i]))
        throw error(errc::invalid_argument, "kvstore: device " + std::to_string(ds[i]) +
                                                " does not exist (" +
                                                std::to_string(rt::device_count()) + " visible)");
      for (std::size_t j = 0; j < i; ++j)
        if (ds[j] == ds[i])
          throw error(errc::invalid_argument,
                      "kvstore: device " + std::to_string(ds[i]) + " listed twice");
    }
    for (int d : ds) devs.push_back(std::make_unique<device_ctx>(d));
    peer.assign(ds.size(), std::vector<char>(ds.size(), 0));
    for (std::size_t i = 0; i < ds.size(); ++i)
      for (std::size_t j = 0; j < ds.size(); ++j) {
        if (i == j || !rt::can_access_peer(ds[i], ds[j])) {
          peer[i][j] = i == j;
          continue;
        }
        rt::enable_peer_access(ds[i], ds[j]);
        peer[i][j] = 1;
      }
  }
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
  std::unordered_map<std::uint64_t, std::unique_ptr<entry>> keys;
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

  std::shared_ptr<const device_optimizer<T>> current_optimizer() {
    std::shared_lock lk(m);
    return opt;
  }

  // The entry of `k` (m held, shared or not). Throws unknown_key, or invalid_argument when k's id
  // belongs to another name.
  entry& find_locked(std::string_view call, const key& k) const {
    auto it = keys.find(k.id());
    if (it == keys.end()) fail(errc::unknown_key, call, k, "never inited");
    check_same_name(call, it->second->k, k);
    return *it->second;
  }
  entry& find(std::string_view call, const key& k) {
    std::shared_lock lk(m);
    return find_locked(call, k);
  }
  entry* try_find(const key& k) {
    std::shared_lock lk(m);
    auto it = keys.find(k.id());
    return it == keys.end() ? nullptr : it->second.get();
  }

  /// Adds the keys, each on its owner (balanced by bytes, or the first device), with its first
  /// value copied there: all of them, or on any error (a key inited before or named twice, a
  /// device failure) none. Holds the store's lock throughout (init is rare and must not race the
  /// placement counts).
  void insert(const std::vector<init_item>& items) {
    std::unique_lock lk(m);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const key& k = items[i].k;
      bool twice = false;
      if (auto hit = keys.find(k.id()); hit != keys.end()) {
        check_same_name("init", hit->second->k, k);
        twice = true;
      }
      for (std::size_t j = 0; j < i && !twice; ++j)
        if (items[j].k.id() == k.id()) {
          check_same_name("init", items[j].k, k);
          twice = true;
        }
      if (twice) fail(errc::already_inited, "init", k, "inited twice");
    }
    std::vector<std::size_t> added(devs.size(), 0);
    std::vector<std::unique_ptr<entry>> made;
    for (auto& it : items) {
      std::size_t at = 0;
      if (opts.placement == placement::balanced)
        for (std::size_t d = 1; d < devs.size(); ++d)
          if (devs[d]->bytes_owned + added[d] < devs[at]->bytes_owned + added[at]) at = d;
      added[at] += it.value.size * sizeof(T);
      const int owner = devs[at]->dev;
      made.push_back(on_device("init", it.k, owner, [&] {
        auto e = std::make_unique<entry>(it.k, it.value.size, it.row_length, owner);
        e->done = rt::event_create(owner);
        rt::device_guard g(owner);
        auto s = devs[at]->streams[0];
        rt::copy_async(e->value.data(), it.value.ptr, it.value.size * sizeof(T), s);
        rt::stream_sync(s);
        return e;
      }));
    }
    for (std::size_t d = 0; d < devs.size(); ++d) devs[d]->bytes_owned += added[d];
    for (auto& e : made) {
      const std::uint64_t id = e->k.id();
      keys.emplace(id, std::move(e));
    }
  }

  /// Queues one part of `st` on e's key: `work(ctx, stream index, stream)` issues the device work
  /// (e.m held), then the part completes when the stream gets there. Errors while issuing fail
  /// the part, named by the call, the key and the owner.
  template <class W>
  void submit(entry& e, int priority, const std::shared_ptr<op_state>& st, std::string_view call,
              bool may_inline, W work) {
    eng.submit(
        e.k.id(), priority,
        [this, ep = &e, st, call, priority, work = std::move(work)](const engine::done_fn& done) {
          try {
            std::lock_guard lk(ep->m);
            on_device(call, ep->k, ep->owner, [&] {
              auto& c = ctx(ep->owner);
              const int si = priority > 0 ? 1 : 0;
              rt::stream_t s = c.streams[si];
              rt::device_guard g(ep->owner);
              // The key's previous op ran on the other stream: wait for it on the device. The
              // event is recorded now, so it may also cover later work of other keys there.
              if (ep->last_stream && ep->last_stream != s) {
                rt::event_record(ep->done, ep->last_stream);
                rt::stream_wait_event(s, ep->done);
              }
              work(c, si, s);
              ep->last_stream = s;
              ep->last_op = st;
              done_q.add(ep->owner, s, st);
            });
          } catch (...) {
            st->complete_part(std::current_exception());
          }
          done(nullptr);
        },
        nullptr, may_inline);
  }

  /// Small values, with no optimizer or a fused one, are issued from the caller's thread when a
  /// pool thread is idle: issuing is cheaper than a hand-off.
  static bool may_inline(const entry& e, const device_optimizer<T>* o) noexcept {
    return e.size < (std::size_t{1} << 16) && (!o || o->fused);
  }

  /// Returns once every op issued on `k` before the call is done, device work included.
  void wait_key(const key& k) {
    eng.wait_key(k.id());  // every op on k issued to its stream
    entry* e = try_find(k);
    if (!e) return;
    std::shared_ptr<op_state> last;
    {
      std::lock_guard lk(e->m);
      last = e->last_op;
    }
    if (!last) return;
    // The key's ops complete in order on the device, so the last one done means all are.
    std::unique_lock lk(last->m);
    last->wait_done(lk);
  }
  /// Returns once every op issued before the call is done, device work included.
  void wait_all() {
    eng.wait_all();
    done_q.drain();
    for (auto& d : devs)
      for (auto s : d->streams) {
        rt::device_guard g(d->dev);
        rt::stream_sync(s);
      }
  }
};

}  // namespace kvstore::detail
