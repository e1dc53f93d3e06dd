// KVStore<dist>'s calls with device_span values (MXNet's dist_device_sync), over the worker of
// client/worker_store.hpp. dist.hpp names dist_device_calls<T> only as a default template
// argument of those calls, so a program that never passes a device_span needs neither this file
// nor Thrust; device.hpp includes it.
//
// Several devices' values are summed on the first one's device, staged through the key's pinned
// host buffer and pushed once; a pull lands in that buffer and is copied to each device
// (device/dist_bridge.hpp does the device work). Same checks and results as the host calls;
// besides, each device_span is checked at the call: its device exists and holds its memory, its
// size is the key's (invalid_argument / size_mismatch naming the key and device).
#pragma once

#include <kvstore/client/worker_store.hpp>
#include <kvstore/detail/checks.hpp>
#include <kvstore/detail/group.hpp>
#include <kvstore/device/dist_bridge.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/key.hpp>
#include <kvstore/op.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore::detail {

template <class T>
struct dist_device_calls {
  using store = worker_store<T>;
  using record = typename store::record;
  using call_kind = typename store::call_kind;
  using bridge = dist_device_bridge<T>;

  /// Stores rank 0's value (copied from its device first).
  static void init(store& s, key k, device_span<const T> value) {
    const auto host = to_host(s, k, value);
    s.init_one(std::move(k), std::span<const T>(host), {});
  }
  static void init(store& s, std::span<const key> ks,
                   std::span<const device_span<const T>> values) {
    check_count("init", ks.size(), "with", values.size(), "values");
    std::vector<std::vector<T>> host;
    for (std::size_t i = 0; i < ks.size(); ++i) host.push_back(to_host(s, ks[i], values[i]));
    const std::vector<std::span<const T>> spans(host.begin(), host.end());
    s.init(ks, std::span<const std::span<const T>>(spans));
  }
  /// Several devices' values of one key: summed on the first one's device, pushed once.
  static op push(store& s, key k, std::span<const device_span<const T>> values, int priority) {
    if (values.empty()) s.fail(errc::invalid_argument, call_kind::push, k, "no values");
    record* m = find_on_devices(s, call_kind::push, k, values);
    return submit(s, m, std::vector<device_span<const T>>(values.begin(), values.end()), priority);
  }
  static op push(store& s, std::span<const key> ks, std::span<const device_span<const T>> values,
                 int priority) {
    auto groups = device_groups(s, call_kind::push, "with", "values", ks, values);
    auto st = s.new_state(groups.size());
    for (auto& [m, srcs] : groups) submit(s, m, std::move(srcs), priority, st);
    return op(st);
  }
  /// Pulled once into pinned memory, then copied to each output's device.
  static op pull(store& s, key k, std::span<const device_span<T>> outs, int priority) {
    if (outs.empty()) s.fail(errc::invalid_argument, call_kind::pull, k, "no outputs");
    record* m = find_on_devices(s, call_kind::pull, k, outs);
    return submit(s, m, std::vector<device_span<T>>(outs.begin(), outs.end()), priority);
  }
  static op pull(store& s, std::span<const key> ks, std::span<const device_span<T>> outs,
                 int priority) {
    auto groups = device_groups(s, call_kind::pull, "into", "outputs", ks, outs);
    auto st = s.new_state(groups.size());
    for (auto& [m, o] : groups) submit(s, m, std::move(o), priority, st);
    return op(st);
  }
  /// Push then pull of one key as one op: `out` gets the value after this push.
  static op pushpull(store& s, key k, device_span<const T> value, device_span<T> out,
                     int priority) {
    record* m = find_on_devices(s, call_kind::pushpull, k,
                                std::span<const device_span<const T>>(&value, 1));
    find_on_devices(s, call_kind::pushpull, k, std::span<const device_span<T>>(&out, 1));
    return s.submit(m, priority, [ws = &s, m, value, out, priority](auto done) {
      gather_and_push(*ws, m, std::span<const device_span<const T>>(&value, 1), priority,
                      [ws, m, out, priority, done](std::exception_ptr e) {
                        if (e) return done(e);
                        pull_and_scatter(*ws, m, {out}, priority, done);
                      });
    });
  }

 private:
  // The store's bridge, made on the first device call.
  static bridge& bridge_of(store& s) {
    std::call_once(s.device_once, [&] { s.device = std::make_shared<bridge>(); });
    return *static_cast<bridge*>(s.device.get());
  }
  static std::vector<T> to_host(store& s, const key& k, const device_span<const T>& v) {
    bridge::check(call_name(call_kind::init), k, v.size, v);
    return bridge_of(s).to_host("init", k, v);
  }
  // The key's record, every buffer checked against it and its device.
  template <class P>
  static record* find_on_devices(store& s, call_kind call, const key& k,
                                 std::span<const device_span<P>> bufs) {
    record* m = s.find(call, k, std::nullopt);
    for (auto& b : bufs) bridge::check(call_name(call), m->k, m->total, b);
    return m;
  }
  template <class P>
  static std::vector<key_group<record*, device_span<P>>> device_groups(
      store& s, call_kind call, std::string_view relation, std::string_view bufs_are,
      std::span<const key> ks, std::span<const device_span<P>> bufs) {
    check_count(call_name(call), ks.size(), relation, bufs.size(), bufs_are);
    return group_by_key<record*>(
        bufs, [&](std::size_t i) { return find_on_devices(s, call, ks[i], bufs.subspan(i, 1)); },
        [](const record* a, const record* b) { return a == b; });
  }

  // Sums srcs into the key's pinned buffer (issued now; srcs are not read after the call), then
  // pushes it; then(e) once the servers have it.
  static void gather_and_push(store& s, record* m, std::span<const device_span<const T>> srcs,
                              int priority, engine::done_fn then) {
    auto& b = bridge_of(s);
    const auto host = b.pinned(m->k.id(), m->total);
    b.gather(call_name(call_kind::push), m->k, srcs, host, priority,
             [ws = &s, m, host, priority, then](std::exception_ptr e) {
               if (e) return then(e);
               try {
                 ws->reqs.push(*m, std::span<const T>(host), priority, then);
               } catch (...) {
                 then(std::current_exception());
               }
             });
  }
  // Pulls the key into its pinned buffer, then copies it to every output; then(e) once they
  // all hold it.
  static void pull_and_scatter(store& s, record* m, std::vector<device_span<T>> outs, int priority,
                               engine::done_fn then) {
    auto& b = bridge_of(s);
    const auto host = b.pinned(m->k.id(), m->total);
    s.reqs.pull(*m, {host}, priority,
                [&b, m, host, outs = std::move(outs), priority, then](std::exception_ptr e) {
                  if (e) return then(e);
                  b.scatter(call_name(call_kind::pull), m->k, host,
                            std::span<const device_span<T>>(outs), priority, then);
                });
  }
  // One op part per key: a push (P const: gather_and_push) or a pull (pull_and_scatter).
  template <class P>
  static op submit(store& s, record* m, std::vector<device_span<P>> bufs, int priority,
                   std::shared_ptr<op_state> st = nullptr) {
    return s.submit(
        m, priority,
        [ws = &s, m, bufs = std::move(bufs), priority](auto done) {
          if constexpr (std::is_const_v<P>)
            gather_and_push(*ws, m, bufs, priority, std::move(done));
          else
            pull_and_scatter(*ws, m, bufs, priority, std::move(done));
        },
        st);
  }
};

}  // namespace kvstore::detail
