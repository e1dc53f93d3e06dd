// The kind of call a request belongs to, and the label an error names it by. The label's text is
// built only when a request fails, not for every request sent.
#pragma once

#include <kvstore/key.hpp>
#include <kvstore/node.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvstore::detail {

enum class call_kind : std::uint8_t {
  init,
  push,
  pull,
  pushpull,
  push_rows,
  pull_rows,
  set_optimizer,
  save_optimizer_states,
  load_optimizer_states,
  send_command_to_servers,
  barrier,
  barrier_before_exit,
  num_dead_node,
  leave,
  checkpoint,
  join,
  bye,
  push_range,
  pull_range,
  slice_of,
  set_key_options,
  version,
};

/// The public call's name, as errors show it.
constexpr std::string_view call_name(call_kind c) noexcept {
  switch (c) {
    case call_kind::init:
      return "init";
    case call_kind::push:
      return "push";
    case call_kind::pull:
      return "pull";
    case call_kind::pushpull:
      return "pushpull";
    case call_kind::push_rows:
      return "push_rows";
    case call_kind::pull_rows:
      return "pull_rows";
    case call_kind::set_optimizer:
      return "set_optimizer";
    case call_kind::save_optimizer_states:
      return "save_optimizer_states";
    case call_kind::load_optimizer_states:
      return "load_optimizer_states";
    case call_kind::send_command_to_servers:
      return "send_command_to_servers";
    case call_kind::set_key_options:
      return "set_key_options";
    case call_kind::barrier:
      return "barrier";
    case call_kind::barrier_before_exit:
      return "barrier before exit";
    case call_kind::num_dead_node:
      return "num_dead_node";
    case call_kind::leave:
      return "leave";
    case call_kind::checkpoint:
      return "checkpoint";
    case call_kind::join:
      return "joining the job";
    case call_kind::bye:
      return "bye";
    case call_kind::push_range:
      return "push_range";
    case call_kind::pull_range:
      return "pull_range";
    case call_kind::slice_of:
      return "slice_of";
    case call_kind::version:
      return "version";
  }
  return "?";
}

/// Calls that change a key's value: refused once this worker left the sync group.
constexpr bool is_push(call_kind c) noexcept {
  return c == call_kind::push || c == call_kind::pushpull || c == call_kind::push_rows ||
         c == call_kind::push_range;
}

/// What a request is, for the message of its error: "push of key 3", "barrier",
/// "set_optimizer on server 1 (node 10)".
struct request_label {
  call_kind kind = call_kind::barrier;
  const kvstore::key* k = nullptr;  ///< the key's record outlives its requests
  int server_id = -1;               ///< node id, for a call sent to every server
  std::uint64_t min_version = 0;    ///< a pull that waits for this version of its key
  std::size_t keys = 1;             ///< a batched request: how many keys, k the first

  std::string str() const {
    std::string s(call_name(kind));
    if (k && keys > 1)
      s += " of " + std::to_string(keys) + " keys (key " + k->str() + " and " +
           std::to_string(keys - 1) + " more)";
    else if (k)
      s += " of key " + k->str();
    if (min_version) s += " (waiting for version " + std::to_string(min_version) + ")";
    if (server_id >= 0) s += " on " + node_name(server_id);
    return s;
  }
};

}  // namespace kvstore::detail
