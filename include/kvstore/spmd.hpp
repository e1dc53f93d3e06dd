// Programs launched SPMD (mpirun, Slurm, torchrun): every process runs the same binary, and a
// KVStore<dist> constructed in a process whose role is server or scheduler runs that role and
// exits the process when the job ends, as MXNet does (roles/spmd.hpp). This header adds what such
// a program may register for its servers: KVSTORE_REGISTER_COMMAND_HANDLER.
#pragma once

#include <kvstore/detail/command_handlers.hpp>
#include <kvstore/optim/registry.hpp>  // KVSTORE_DETAIL_CONCAT

/// Registers `fn` (any callable `void(int head, std::string_view body)`) as a command handler of
/// the servers this program runs when launched SPMD (mpirun, Slurm, torchrun: every process the
/// same binary), so kv.send_command_to_servers reaches it. Use at namespace scope, followed by a
/// semicolon; several registrations all run, in the order they were registered. Servers started
/// as kv_server run kv_server's own handler instead.
#define KVSTORE_REGISTER_COMMAND_HANDLER(fn)                                               \
  [[maybe_unused]] static const bool KVSTORE_DETAIL_CONCAT(                                \
      kvstore_registered_command_handler_, KVSTORE_DETAIL_CONCAT(__COUNTER__, __LINE__)) = \
      ::kvstore::detail::register_command_handler(fn)
