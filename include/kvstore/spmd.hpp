// The server loop for programs launched SPMD (mpirun, Slurm, torchrun): every process runs the
// same binary, and a KVStore<dist> constructed in a process whose role is server or scheduler
// runs that role and exits the process when the job ends, as MXNet does. kvstore.hpp includes
// this; a program that includes only dist.hpp never compiles the server loop.
#pragma once

#include <kvstore/colocated.hpp>
#include <kvstore/detail/log.hpp>
#include <kvstore/dist.hpp>
#include <kvstore/options.hpp>
#include <kvstore/rendezvous/scheduler.hpp>
#include <kvstore/server/server.hpp>

#include <cstdlib>
#include <exception>

namespace kvstore::detail {

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

/// Registers the loop with KVStore<dist> before main() runs.
inline const bool spmd_loop_registered = (run_other_role = &run_role_and_exit, true);

}  // namespace kvstore::detail
