// What the tests of compat/mxnet.hpp's dist stores share: create("dist...") reads the
// environment, so worker_env points it at a job on this machine; run_workers runs one worker per
// thread, each with its own store made by name.
#pragma once

#include <kvstore/compat/mxnet.hpp>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kvtest::mxnet {

/// Sets the environment a worker's dist_options::from_env() reads, for a job of `workers`
/// workers and `servers` servers whose scheduler listens on 127.0.0.1:port, clearing every other
/// variable that could change it (whatever launched ctest); puts it all back when destroyed.
/// setenv is not thread-safe: make it before the worker threads start, destroy it after they
/// joined, and with no node running that still reads the environment.
class worker_env {
 public:
  worker_env(std::uint16_t port, int workers, int servers) {
    for (const char* name : vars) {
      const char* v = std::getenv(name);
      saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(name);
    }
    set("KVSTORE_ROLE", "worker");
    set("KVSTORE_SCHEDULER", "127.0.0.1:" + std::to_string(port));
    set("KVSTORE_NUM_WORKERS", std::to_string(workers));
    set("KVSTORE_NUM_SERVERS", std::to_string(servers));
    // Short deadlines: a worker stuck waiting for a round fails in seconds, not minutes.
    set("KVSTORE_CONNECT_TIMEOUT_MS", "20000");
    set("KVSTORE_REQUEST_TIMEOUT_MS", "10000");
    set("KVSTORE_BARRIER_TIMEOUT_MS", "20000");
    set("KVSTORE_HEARTBEAT_MS", "100");
  }
  ~worker_env() {
    for (auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  worker_env(const worker_env&) = delete;
  worker_env& operator=(const worker_env&) = delete;

 private:
  static constexpr const char* vars[] = {"KVSTORE_ROLE",
                                         "DMLC_ROLE",
                                         "KVSTORE_SCHEDULER",
                                         "DMLC_PS_ROOT_URI",
                                         "DMLC_PS_ROOT_PORT",
                                         "KVSTORE_NUM_WORKERS",
                                         "DMLC_NUM_WORKER",
                                         "KVSTORE_NUM_SERVERS",
                                         "DMLC_NUM_SERVER",
                                         "KVSTORE_TYPE",
                                         "KVSTORE_TOKEN",
                                         "KVSTORE_RANK",
                                         "KVSTORE_CONNECT_TIMEOUT_MS",
                                         "KVSTORE_REQUEST_TIMEOUT_MS",
                                         "KVSTORE_BARRIER_TIMEOUT_MS",
                                         "KVSTORE_HEARTBEAT_MS",
                                         "OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "PMI_RANK",
                                         "PMI_SIZE",
                                         "PMIX_RANK",
                                         "PMIX_SIZE",
                                         "SLURM_PROCID",
                                         "SLURM_NTASKS",
                                         "RANK",
                                         "WORLD_SIZE",
                                         "MASTER_ADDR",
                                         "MASTER_PORT"};
  static void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  std::map<std::string, std::optional<std::string>> saved_;
};

/// Runs f(kv) on `workers` threads, each with its own KVStore::create(name); rethrows the first
/// exception once all joined.
template <class F>
void run_workers(int workers, std::string_view name, F f) {
  std::mutex m;
  std::exception_ptr first;
  std::vector<std::thread> ts;
  for (int w = 0; w < workers; ++w)
    ts.emplace_back([&] {
      try {
        auto kv = kvstore::compat::mxnet::KVStore::create(name);
        f(kv);
      } catch (...) {
        std::lock_guard lk(m);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace kvtest::mxnet
