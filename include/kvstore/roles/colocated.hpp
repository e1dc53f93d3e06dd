// Colocated servers (dist_options::colocated, BigDL's layout): a worker process that also serves
// one shard of the job, its server rank equal to its worker rank, and for rank 0 of an SPMD launch
// also runs the scheduler. Each runs its own io loop on its own thread, exactly as in a process of
// its own (server/server.hpp, rendezvous/scheduler.hpp); the worker reaches its own shard over
// loopback TCP like any other. KVStore<dist>'s constructor starts them (impl/dist.hpp). The
// server runs the command handlers the program registered (KVSTORE_REGISTER_COMMAND_HANDLER,
// spmd.hpp), as an SPMD server does.
//
// Lifetime: they start before the worker joins (the server's address goes with the worker's
// registration, so the scheduler pairs the ranks) and stop after it left: once the worker said
// goodbye, the server serves the others until the scheduler ends the job (every worker gone), at
// most barrier_timeout, then stops; the threads are always joined. A construction that fails stops
// them at once.
#pragma once

#include <kvstore/client/colocated_roles.hpp>
#include <kvstore/detail/command_handlers.hpp>
#include <kvstore/detail/log.hpp>
#include <kvstore/options.hpp>
#include <kvstore/rendezvous/scheduler.hpp>
#include <kvstore/server/server.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace kvstore::detail {

/// One node loop on a thread of its own; its end (normal or by an exception, logged) is waited
/// for with a deadline.
class role_thread {
 public:
  role_thread() = default;
  role_thread(const role_thread&) = delete;
  role_thread& operator=(const role_thread&) = delete;
  ~role_thread() { join(); }

  template <class F>
  void start(std::string who, F run) {
    thread_ = std::thread([this, who = std::move(who), run = std::move(run)] {
      try {
        run();
      } catch (const std::exception& e) {
        log_warn(who, e.what());
      }
      std::lock_guard lk(m_);
      done_ = true;
      cv_.notify_all();
    });
  }
  /// True once the loop returned, waiting for it until `deadline` at most.
  bool wait_until(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lk(m_);
    return cv_.wait_until(lk, deadline, [&] { return done_; });
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
};

/// A colocated worker's server, and rank 0's scheduler in an SPMD launch.
class colocated_node final : public colocated_roles {
 public:
  /// Binds and starts them. Throws kvstore::error(unreachable) when a socket cannot be bound.
  explicit colocated_node(const dist_options& worker) {
    if (worker.colocated_scheduler) {
      auto so = worker;
      so.role = role::scheduler;
      sched_ = std::make_unique<scheduler>(so);
      sched_thread_.start("scheduler", [s = sched_.get()] { s->run(); });
    }
    auto so = worker;
    so.role = role::server;  // with the worker's rank hint: server rank = worker rank
    so.colocated = false;
    so.colocated_scheduler = false;
    try {
      server_ = std::make_unique<server>(so);
      if (auto h = registered_command_handler()) server_->on_command(std::move(h));
    } catch (...) {
      stop();
      throw;
    }
    server_thread_.start("server", [s = server_.get()] { s->run(); });
  }

  colocated_node(const colocated_node&) = delete;
  colocated_node& operator=(const colocated_node&) = delete;

  ~colocated_node() override {
    if (linger_.count() > 0) {
      const auto deadline = std::chrono::steady_clock::now() + linger_;
      if (!server_thread_.wait_until(deadline))
        log_warn("server", "the job did not end within " + std::to_string(linger_.count()) +
                               " ms after this worker left: stopping this process's server");
      if (sched_ && !sched_thread_.wait_until(deadline + std::chrono::seconds(1)))
        log_warn("scheduler", "the job did not end within " + std::to_string(linger_.count()) +
                                  " ms after this worker left: stopping the scheduler");
    }
    stop();
  }

  own_server address() const override { return {server_->advertised_host(), server_->port()}; }

  void linger(std::chrono::milliseconds limit) noexcept override { linger_ = limit; }

 private:
  // Stops whatever still runs (a loop that ended ignores it) and joins the threads.
  void stop() noexcept {
    if (server_) server_->stop();
    if (sched_) sched_->stop();
    server_thread_.join();
    sched_thread_.join();
  }

  std::unique_ptr<scheduler> sched_;
  std::unique_ptr<server> server_;
  role_thread sched_thread_, server_thread_;  // declared after the nodes: joined before they go
  std::chrono::milliseconds linger_{0};
};

/// A colocated worker's roles, started (dist_options::colocated, already resolved).
inline std::unique_ptr<colocated_roles> start_colocated(const dist_options& o) {
  return std::make_unique<colocated_node>(o);
}

}  // namespace kvstore::detail
