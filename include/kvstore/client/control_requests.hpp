// A worker's requests that carry no key's values: what every server answers (optimizer,
// commands, checkpoint, leave) and the scheduler's (barrier, dead nodes), and the fan-in of a
// request's parts into its op, which every request uses. Not a template: requests<T>
// (client/requests.hpp) adds a key's data and the optimizer states, which depend on T.
#pragma once

#include <kvstore/client/call.hpp>
#include <kvstore/client/client.hpp>
#include <kvstore/detail/block_pool.hpp>
#include <kvstore/node.hpp>
#include <kvstore/op.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/messages.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace kvstore::detail {

class control_requests {
 public:
  /// Runs once an op's every request is answered: nullptr, or the first error.
  using done_fn = op_state::continuation;

  explicit control_requests(worker_client& c)
      : client_(c), spin_us_(static_cast<unsigned>(c.options().wait_spin.count())) {}

  int num_servers() const noexcept { return client_.num_servers(); }

  // ---- every server; each call blocks until all answered ------------------------------------
  void set_optimizer(const std::string& name, const std::string& params) {
    const std::string meta = wire::encode_optimizer({name, params});
    to_all_servers(call_kind::set_optimizer, [&](int) {
      transport::out_frame f;
      f.h = wire::plain(wire::cmd::set_optimizer);
      f.meta = meta;
      return f;
    });
  }

  void command(int head, std::string_view body) {
    const std::string b(body);
    to_all_servers(call_kind::send_command_to_servers, [&](int) {
      transport::out_frame f;
      f.h = wire::command_header(head);
      f.meta = b;
      return f;
    });
  }

  /// Asks every server to write its snapshot now.
  void checkpoint() { header_only_to_all_servers(call_kind::checkpoint, wire::cmd::checkpoint); }

  /// No more rounds from this worker: servers first, then the scheduler.
  void leave() {
    header_only_to_all_servers(call_kind::leave, wire::cmd::leave);
    to_scheduler(call_kind::leave, wire::cmd::leave);
  }

  // ---- the scheduler -----------------------------------------------------------------------
  /// Returns once every worker reached it (kind: barrier, or the one before exit).
  void barrier(call_kind kind, std::chrono::milliseconds timeout) {
    to_scheduler(kind, wire::cmd::barrier, timeout);
  }

  /// How many nodes of `groups` the scheduler has not heard from for `timeout_ms`. Throws when
  /// the scheduler cannot answer.
  std::uint64_t dead_count(int groups, std::uint64_t timeout_ms) {
    transport::out_frame f;
    f.h = wire::dead_count_header(groups, timeout_ms);
    std::uint64_t n = 0;
    worker_client::request r;
    r.what = {call_kind::num_dead_node};
    r.timeout = std::chrono::milliseconds(10'000);
    r.on_response = [&n](const wire::header& h, std::span<const std::byte>) { n = h.aux; };
    client_.call(worker_client::to_scheduler, worker_client::single(std::move(f)), std::move(r));
    return n;
  }

 protected:
  // One part per request; `done` runs when the last one completes.
  static std::shared_ptr<op_state> fan_in(std::size_t parts, done_fn done) {
    return make_pooled<op_state>(parts, std::move(done));
  }

  // A frame of `c` answered once the scheduler is done with it.
  void to_scheduler(call_kind kind, wire::cmd c, std::chrono::milliseconds timeout = {}) {
    transport::out_frame f;
    f.h = wire::plain(c);
    worker_client::request r;
    r.what = {kind};
    r.timeout = timeout;
    client_.call(worker_client::to_scheduler, worker_client::single(std::move(f)), std::move(r));
  }

  void header_only_to_all_servers(call_kind kind, wire::cmd c) {
    to_all_servers(kind, [c](int) {
      transport::out_frame f;
      f.h = wire::plain(c);
      return f;
    });
  }

  // The fan-in state for one request of a loop over a key's slices: the last one takes it, the
  // others copy it (each copy of a shared_ptr is a locked increment, a full barrier).
  static std::shared_ptr<op_state> share(std::shared_ptr<op_state>& all, bool last) {
    return last ? std::move(all) : all;
  }

  static worker_client::request part_of(std::shared_ptr<op_state> all, request_label what) {
    worker_client::request r;
    r.done = std::move(all);
    r.what = what;
    return r;
  }

  // Sends make(server) to every server and waits for all answers; on_response sees each answer.
  template <class Make>
  void to_all_servers(
      call_kind kind, Make&& make,
      std::function<void(const wire::header&, std::span<const std::byte>)> on_response = {},
      std::function<void(std::string_view)> on_text = {}) {
    auto all = make_pooled<op_state>(static_cast<std::size_t>(num_servers()));
    all->spin_us = spin_us_;
    for (int s = 0; s < num_servers(); ++s) {
      worker_client::request r = part_of(all, {kind, nullptr, server_id(s)});
      r.on_response = on_response;
      r.on_text = on_text;
      client_.send(s, make(s), std::move(r));
    }
    op(all).wait();
  }

  worker_client& client_;
  const unsigned spin_us_;
};

}  // namespace kvstore::detail
