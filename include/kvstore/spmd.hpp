// The server loop for programs launched SPMD (mpirun, Slurm, torchrun): every process runs the
// same binary, and a KVStore<dist> constructed in a process whose role is server or scheduler
// runs that role and exits the process when the job ends, as MXNet does. kvstore.hpp includes
// this; the server loop is compiled in a source file that includes this and constructs a store
// (a program that includes only dist.hpp never compiles it). Such servers run the command
// handlers the program registered (KVSTORE_REGISTER_COMMAND_HANDLER).
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/dist.hpp>
#include <kvstore/options.hpp>
#include <kvstore/rendezvous/scheduler.hpp>
#include <kvstore/server/server.hpp>

#include <cstdlib>
#include <exception>
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

/// Runs the scheduler or server loop for a process whose role is not worker, then exits it.
[[noreturn]] inline void run_role_and_exit(const dist_options& o) {
  int rc = 0;
  try {
    if (o.role == role::scheduler) {
      scheduler s(o);
      s.run();
    } else {
      server s(o);
      if (auto h = registered_command_handler()) s.on_command(std::move(h));
      s.run();
    }
  } catch (const std::exception& e) {
    log_warn(role_name(o.role), e.what());
    rc = 1;
  }
  std::exit(rc);
}

/// Registers the loop with KVStore<dist> before main() runs, from each source file that
/// constructs a store (dist.hpp).
template <class T>
struct loop_registrar<spmd_loop, T> {
  static inline const bool registered = (run_other_role = &run_role_and_exit, true);
};

}  // namespace detail
}  // namespace kvstore

/// Registers `fn` (any callable `void(int head, std::string_view body)`) as a command handler of
/// the servers this program runs when launched SPMD (mpirun, Slurm, torchrun: every process the
/// same binary), so kv.send_command_to_servers reaches it. Use at namespace scope, followed by a
/// semicolon; several registrations all run, in the order they were registered. Servers started
/// as kv_server run kv_server's own handler instead.
#define KVSTORE_REGISTER_COMMAND_HANDLER(fn)                                               \
  [[maybe_unused]] static const bool KVSTORE_DETAIL_CONCAT(                                \
      kvstore_registered_command_handler_, KVSTORE_DETAIL_CONCAT(__COUNTER__, __LINE__)) = \
      ::kvstore::detail::register_command_handler(fn)
