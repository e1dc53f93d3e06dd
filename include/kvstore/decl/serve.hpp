// kvstore::serve and kvstore::node_loop declared (serve.hpp); their bodies are roles/node_loop.hpp.
#pragma once

#include <kvstore/detail/command_handlers.hpp>
#include <kvstore/detail/config.hpp>
#include <kvstore/options.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace kvstore {

/// A scheduler or a server of a job (o.role), bound to its port at construction; run() serves
/// on the calling thread until the job ends or stop() is called from another thread. A server
/// runs the command handlers the program registered (KVSTORE_REGISTER_COMMAND_HANDLER) unless
/// on_command sets another. Throws kvstore::error from the constructor when o is not a
/// scheduler's or server's, or the port cannot be bound.
class node_loop {
 public:
  KVSTORE_DECL explicit node_loop(const dist_options& o);
  node_loop(const node_loop&) = delete;
  node_loop& operator=(const node_loop&) = delete;
  KVSTORE_DECL ~node_loop();

  KVSTORE_DECL void run();
  /// Ends run(): safe from any thread, and before run() was called.
  KVSTORE_DECL void stop();
  /// The port it listens on (the one asked for, or the one the system gave for port 0).
  KVSTORE_DECL std::uint16_t port() const;
  /// Connections its accept loop failed to take (EMFILE and the like), each logged and retried.
  KVSTORE_DECL std::uint64_t accept_errors() const noexcept;
  /// The host a server tells workers to connect to; the scheduler's own host for a scheduler.
  KVSTORE_DECL std::string advertised_host() const;
  /// The server's rank once the scheduler gave it one (-1 before); 0 for the scheduler.
  KVSTORE_DECL int rank() const noexcept;
  /// A server's command handler (kv.send_command_to_servers), replacing the registered ones.
  /// Throws invalid_argument on a scheduler.
  KVSTORE_DECL void on_command(command_handler h);

 private:
  struct nodes;
  std::unique_ptr<nodes> nodes_;
};

/// Runs this process's scheduler or server (o.role) until the job ends: what kv_server and an
/// SPMD-launched program's server processes do. Throws what node_loop throws.
KVSTORE_DECL void serve(const dist_options& o);

}  // namespace kvstore
