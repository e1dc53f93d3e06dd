// What a process launched SPMD (mpirun, Slurm, torchrun: every process the same binary) runs when
// its role is server or scheduler: KVStore<dist>'s constructor calls run_role_and_exit
// (impl/dist.hpp) instead of joining as a worker, as MXNet does. Such servers run the command
// handlers the program registered (KVSTORE_REGISTER_COMMAND_HANDLER).
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/node.hpp>
#include <kvstore/options.hpp>
#include <kvstore/roles/node_loop.hpp>

#include <cstdlib>
#include <exception>

namespace kvstore::detail {

/// Runs the scheduler or server of a process whose role is not worker (kvstore::serve), then
/// exits it: 0 when the job ended, 1 (the reason logged) when the node failed.
[[noreturn]] inline void run_role_and_exit(const dist_options& o) {
  int rc = 0;
  try {
    serve(o);
  } catch (const std::exception& e) {
    log_warn(role_name(o.role), e.what());
    rc = 1;
  }
  std::exit(rc);
}

}  // namespace kvstore::detail
