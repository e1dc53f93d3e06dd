// Threads-as-ranks harness for dist tests: a scheduler and servers run as threads of the test
// process on 127.0.0.1 (port 0: no clashes between parallel tests), workers as threads too (with
// colocated options each worker's store serves a shard itself, and no server thread starts); the
// first failure of any thread is rethrown. Every wait is bounded by the options' deadlines.
#pragma once

#include <kvstore/kvstore.hpp>

#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

namespace kvtest {

inline kvstore::dist_options test_options(int workers, int servers, bool sync = true) {
  kvstore::dist_options o;
  o.scheduler_host = "127.0.0.1";
  o.scheduler_port = 0;
  o.num_workers = workers;
  o.num_servers = servers;
  o.sync = sync;
  o.connect_timeout = std::chrono::milliseconds(20'000);
  o.request_timeout = std::chrono::milliseconds(20'000);
  o.barrier_timeout = std::chrono::milliseconds(20'000);
  o.heartbeat_interval = std::chrono::milliseconds(100);
  o.dead_timeout = std::chrono::milliseconds(3'000);
  o.threads = 2;
  // A dead worker fails the others' rounds with an error naming it (the library's default lets
  // it leave the group instead); tests of leaving set leave_group themselves.
  o.on_worker_death = kvstore::worker_death::fail;
  // KVTEST_LINK=inproc: the same job over the in-process link (transport/inproc.hpp), no sockets.
  if (const char* link = std::getenv("KVTEST_LINK"); link && std::string_view(link) == "inproc")
    o.scheduler_host = o.bind_host = "inproc";
  return o;
}

class cluster {
 public:
  explicit cluster(kvstore::dist_options o) : opts_(std::move(o)) {
    auto sched_opts = opts_;
    sched_opts.role = kvstore::role::scheduler;
    sched_ = std::make_unique<kvstore::node_loop>(sched_opts);
    opts_.scheduler_port = sched_->port();
    threads_.emplace_back([this] { guard([&] { sched_->run(); }); });
    // Colocated (dist_options::colocated): every worker's store runs its own server.
    for (int s = 0; s < opts_.num_servers && !opts_.colocated; ++s) {
      auto so = opts_;
      so.role = kvstore::role::server;
      so.rank_hint = s;
      servers_.push_back(std::make_unique<kvstore::node_loop>(so));
    }
    for (auto& s : servers_) {
      auto* p = s.get();
      threads_.emplace_back([this, p] { guard([&] { p->run(); }); });
    }
  }
  ~cluster() {
    for (auto& s : servers_) s->stop();
    sched_->stop();
    for (auto& t : threads_) t.join();
  }

  const kvstore::dist_options& options() const { return opts_; }
  kvstore::node_loop& server(int i) { return *servers_[static_cast<std::size_t>(i)]; }
  kvstore::node_loop& scheduler() { return *sched_; }

  /// Runs f(kv) on num_workers threads, each with its own KVStore<dist, T> (rank = thread
  /// index); rethrows the first exception after all joined.
  template <class T = float, class F>
  void run_workers(F f) {
    std::vector<std::thread> ws;
    for (int w = 0; w < opts_.num_workers; ++w) {
      ws.emplace_back([this, w, &f] {
        guard([&] {
          auto o = opts_;
          o.role = kvstore::role::worker;
          o.rank_hint = w;
          kvstore::KVStore<kvstore::dist, T> kv(o);
          f(kv);
        });
      });
    }
    for (auto& t : ws) t.join();
    rethrow();
  }

  void rethrow() {
    std::lock_guard lk(m_);
    if (first_) std::rethrow_exception(first_);
  }

 private:
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (...) {
      std::lock_guard lk(m_);
      if (!first_) first_ = std::current_exception();
    }
  }

  kvstore::dist_options opts_;
  std::unique_ptr<kvstore::node_loop> sched_;
  std::vector<std::unique_ptr<kvstore::node_loop>> servers_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::exception_ptr first_;
};

}  // namespace kvtest
