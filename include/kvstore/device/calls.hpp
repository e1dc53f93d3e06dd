// What KVStore<device, T>'s calls (device/store.hpp) do behind the API: each buffer checked
// against the store's devices and the key, a multi-key call's buffers grouped by key, and the
// work handed to the key's task (device/store_state.hpp's submit) as one part per key.
#pragma once

#include <kvstore/detail/checks.hpp>
#include <kvstore/detail/group.hpp>
#include <kvstore/device/checks.hpp>
#include <kvstore/device/key_state.hpp>
#include <kvstore/device/optimizer.hpp>
#include <kvstore/device/push_pull.hpp>
#include <kvstore/device/rows.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/device/store_state.hpp>
#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/op.hpp>
#include <kvstore/optim/all.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// The base of KVStore<device, T>: the store's state, and the checks and work of its calls.
template <class T>
class device_calls {
 protected:
  explicit device_calls(const device_options& o) : impl_(std::make_unique<device_impl<T>>(o)) {}

  using entry = detail::device_entry<T>;
  using in_ref = detail::dev_ref<const T>;
  using out_ref = detail::dev_ref<T>;
  using group = detail::key_group<entry*, in_ref>;
  using ogroup = detail::key_group<entry*, out_ref>;

  // ---- argument checks (at the call, before anything is queued) ------------------------------

  // A buffer of a call: a device_span checked against the store's devices, or host memory.
  template <class P>
  detail::dev_ref<P> ref(std::string_view call, const key& k, device_span<P> s) const {
    detail::check_device_span(call, k, s, &impl_->opts.devices);
    return detail::to_ref(s);
  }
  template <class P>
  detail::dev_ref<P> ref(std::string_view, const key&, std::span<P> s) const {
    return detail::to_ref(s);
  }
  template <class L>
  auto refs(std::string_view call, const key& k, const L& bufs) const {
    std::vector<decltype(ref(call, k, *std::begin(bufs)))> out;
    out.reserve(std::size(bufs));
    for (const auto& b : bufs) out.push_back(ref(call, k, b));
    return out;
  }

  // A buffer of `e`'s size; a device buffer's error names its device.
  template <class P>
  static void check_size(std::string_view call, const entry& e, const detail::dev_ref<P>& r) {
    detail::check_size(call, e.k, e.size, r.size,
                       r.dev >= 0 ? "on device " + std::to_string(r.dev) + ", " : std::string());
  }
  static void check_rows(std::string_view call, const entry& e, std::span<const std::int64_t> rows,
                         std::size_t n) {
    detail::check_rows(call, e.k, e.size, e.row_length, rows, n);
  }

  // ---- init ----------------------------------------------------------------------------------

  template <class S>
  void init_one(key k, S value, std::size_t row_length) {
    auto v = ref("init", k, value);
    impl_->insert({{std::move(k), v, row_length}});
  }

  template <class S>
  void init_many(std::span<const key> ks, std::span<const S> values) {
    detail::check_count("init", ks.size(), "with", values.size(), "values");
    std::vector<typename detail::device_impl<T>::init_item> items;
    items.reserve(ks.size());
    for (std::size_t i = 0; i < ks.size(); ++i)
      items.push_back({ks[i], ref("init", ks[i], values[i]), 0});
    impl_->insert(items);
  }

  // ---- the data calls: checked, grouped by key, then one part per key ------------------------

  template <class S>
  op push_list(const key& k, std::span<const S> values, int priority) {
    if (values.empty()) detail::fail(errc::invalid_argument, "push", k, "no values");
    auto& e = impl_->find("push", k);
    return push_groups("push", {group{&e, refs("push", k, values)}}, priority);
  }
  template <class S>
  op pull_list(const key& k, std::span<const S> outs, int priority) {
    if (outs.empty()) detail::fail(errc::invalid_argument, "pull", k, "no outputs");
    auto& e = impl_->find("pull", k);
    return pull_groups("pull", {ogroup{&e, refs("pull", k, outs)}}, priority);
  }

  // The buffers of a multi-key call, checked, grouped by key (detail/group.hpp).
  template <class Ref, class S>
  std::vector<detail::key_group<entry*, Ref>> group_many(std::string_view call,
                                                         std::string_view relation,
                                                         std::string_view bufs_are,
                                                         std::span<const key> ks,
                                                         std::span<const S> bufs) {
    detail::check_count(call, ks.size(), relation, bufs.size(), bufs_are);
    std::vector<Ref> rs;
    rs.reserve(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) rs.push_back(ref(call, ks[i], bufs[i]));
    std::shared_lock lk(impl_->m);
    return detail::group_by_key<entry*>(
        std::span<const Ref>(rs), [&](std::size_t i) { return &impl_->find_locked(call, ks[i]); },
        std::equal_to<>{});
  }
  template <class S>
  op push_many(std::span<const key> ks, std::span<const S> values, int priority) {
    return push_groups("push", group_many<in_ref>("push", "with", "values", ks, values), priority);
  }
  template <class S>
  op pull_many(std::span<const key> ks, std::span<const S> outs, int priority) {
    return pull_groups("pull", group_many<out_ref>("pull", "into", "outputs", ks, outs), priority);
  }

  op push_groups(std::string_view call, std::vector<group> groups, int priority) {
    for (auto& g : groups)
      for (auto& r : g.bufs) check_size(call, *g.h, r);
    if (groups.empty()) return op::done();
    auto opt = impl_->current_optimizer();
    auto st = std::make_shared<detail::op_state>(groups.size());
    for (auto& g : groups) {
      entry& e = *g.h;
      impl_->submit(e, priority, st, call, impl_->may_inline(e, opt.get()),
                    [impl = impl_.get(), ep = &e, in = std::move(g.bufs), opt](
                        detail::device_ctx& c, int si, detail::rt::stream_t s) {
                      detail::issue_push(*impl, *ep, c, si, s, std::span<const in_ref>(in),
                                         opt.get());
                    });
    }
    return op(std::move(st));
  }

  op pull_groups(std::string_view call, std::vector<ogroup> groups, int priority) {
    for (auto& g : groups)
      for (auto& r : g.bufs) check_size(call, *g.h, r);
    if (groups.empty()) return op::done();
    auto st = std::make_shared<detail::op_state>(groups.size());
    for (auto& g : groups) {
      entry& e = *g.h;
      impl_->submit(e, priority, st, call, impl_->may_inline(e, nullptr),
                    [impl = impl_.get(), ep = &e, outs = std::move(g.bufs)](
                        detail::device_ctx&, int, detail::rt::stream_t s) {
                      detail::issue_pull(*impl, *ep, s, std::span<const out_ref>(outs));
                    });
    }
    return op(std::move(st));
  }

  template <class In, class Out>
  op pushpull_impl(const key& k, In value, Out out, int priority) {
    auto& e = impl_->find("pushpull", k);
    const in_ref v = ref("pushpull", k, value);
    const out_ref o = ref("pushpull", k, out);
    check_size("pushpull", e, v);
    check_size("pushpull", e, o);
    auto opt = impl_->current_optimizer();
    return one_part(e, priority, "pushpull", opt.get(),
                    [impl = impl_.get(), ep = &e, v, o, opt](detail::device_ctx& c, int si,
                                                             detail::rt::stream_t s) {
                      detail::issue_push(*impl, *ep, c, si, s, std::span<const in_ref>(&v, 1),
                                         opt.get());
                      detail::issue_pull(*impl, *ep, s, std::span<const out_ref>(&o, 1));
                    });
  }

  template <class In>
  op push_rows_impl(const key& k, std::span<const std::int64_t> rows, In values, int priority) {
    auto& e = impl_->find("push_rows", k);
    const in_ref v = ref("push_rows", k, values);
    check_rows("push_rows", e, rows, v.size);
    auto opt = impl_->current_optimizer();
    return one_part(e, priority, "push_rows", opt.get(),
                    [impl = impl_.get(), ep = &e, rows, v, opt](detail::device_ctx&, int,
                                                                detail::rt::stream_t s) {
                      detail::issue_push_rows(*impl, *ep, s, rows, v, opt.get());
                    });
  }

  template <class Out>
  op pull_rows_impl(const key& k, std::span<const std::int64_t> rows, Out out, int priority) {
    auto& e = impl_->find("pull_rows", k);
    const out_ref o = ref("pull_rows", k, out);
    check_rows("pull_rows", e, rows, o.size);
    return one_part(
        e, priority, "pull_rows", nullptr,
        [impl = impl_.get(), ep = &e, rows, o](detail::device_ctx&, int, detail::rt::stream_t s) {
          detail::issue_pull_rows(*impl, *ep, s, rows, o);
        });
  }

  // An op of one part on e's key (device/store_state.hpp's submit).
  template <class W>
  op one_part(entry& e, int priority, std::string_view call, const detail::device_optimizer<T>* opt,
              W work) {
    auto st = std::make_shared<detail::op_state>(1);
    impl_->submit(e, priority, st, call, impl_->may_inline(e, opt), std::move(work));
    return op(std::move(st));
  }

  void install(optim::updater<T> u) {
    impl_->wait_all();
    std::unique_lock lk(impl_->m);
    // The same registered type keeps the states' generation, so they carry on with the new
    // parameters; a callable or another type starts a new one.
    const bool same = impl_->opt && !u.name.empty() && impl_->opt->u.name == u.name;
    const std::uint64_t gen = same ? impl_->opt->gen : ++impl_->generation;
    impl_->opt = detail::make_device_optimizer<T>(std::move(u), gen);
  }

  std::unique_ptr<detail::device_impl<T>> impl_;
};

}  // namespace kvstore::detail
