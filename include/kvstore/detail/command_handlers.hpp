// The command handlers a program registers (KVSTORE_REGISTER_COMMAND_HANDLER, spmd.hpp): what its
// servers run for kv.send_command_to_servers when they are started from the program itself (an
// SPMD launch, a colocated worker, kvstore::serve). Free of Asio: spmd.hpp's macro needs only this.
#pragma once

#include <functional>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

namespace kvstore {

/// What a server does with kv.send_command_to_servers(head, body): runs on the server's io
/// thread; an exception it throws fails that worker's call with its message (server_error).
using command_handler = std::function<void(int head, std::string_view body)>;

namespace detail {

/// The handlers a program registered, in registration order (KVSTORE_REGISTER_COMMAND_HANDLER).
struct command_handlers {
  std::mutex m;
  std::vector<command_handler> all;
};
inline command_handlers& registered_command_handlers() {
  static command_handlers r;  // exists before any static initializer of another file uses it
  return r;
}
inline bool register_command_handler(command_handler h) {
  auto& r = registered_command_handlers();
  std::lock_guard lk(r.m);
  r.all.push_back(std::move(h));
  return true;
}
/// One handler running every registered one in order; empty when none is registered (the
/// server then answers commands with errc::unsupported).
inline command_handler registered_command_handler() {
  auto& r = registered_command_handlers();
  std::lock_guard lk(r.m);
  if (r.all.empty()) return {};
  return [all = r.all](int head, std::string_view body) {
    for (auto& h : all) h(head, body);
  };
}

}  // namespace detail
}  // namespace kvstore
