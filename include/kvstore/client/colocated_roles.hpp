// What a worker knows of the server its own process runs (dist_options::colocated): where it
// listens, and how to stop it. roles/colocated.hpp implements it; the worker only names it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kvstore::detail {

/// Where a worker's own server listens in a colocated job (dist_options::colocated), as that
/// server registers it: the scheduler gives the worker its server's rank.
struct own_server {
  std::string host;
  std::uint16_t port = 0;
};

/// What a colocated worker process runs beside its worker: its server, and for rank 0 of an SPMD
/// launch the scheduler, each on its own thread (roles/colocated.hpp). Destroying it stops them
/// and joins their threads; after linger() it first lets the server serve the other workers
/// until the job ends.
class colocated_roles {
 public:
  virtual ~colocated_roles() = default;
  /// Where this process's server listens, as it registers with the scheduler.
  virtual own_server address() const = 0;
  /// This worker said goodbye: on destruction, serve until the scheduler ends the job (every
  /// worker gone), at most `limit`, before stopping.
  virtual void linger(std::chrono::milliseconds limit) noexcept = 0;
};

}  // namespace kvstore::detail
