// dist_options::apply_env(): the environment, in lookup order, onto the options' fields. Kept
// apart from options.hpp so the options structs read as a list of settings.
#pragma once

#include <kvstore/detail/env.hpp>
#include <kvstore/options.hpp>

#include <cerrno>
#include <limits>
#include <string>
#include <type_traits>

namespace kvstore {

inline void dist_options::apply_env() {
  namespace env = detail::env;
  const bool role_given = env::first_of("KVSTORE_ROLE", "DMLC_ROLE").has_value();
  if (auto v = env::first_of("KVSTORE_ROLE", "DMLC_ROLE")) {
    const char* name = env::get("KVSTORE_ROLE") ? "KVSTORE_ROLE" : "DMLC_ROLE";
    try {
      role = env::parse_role(*v);
    } catch (const error& e) {
      throw error(errc::invalid_argument, std::string(name) + ": " + e.what());
    }
  }
  if (auto v = env::first_of("KVSTORE_SCHEDULER")) {
    auto colon = v->rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw error(errc::invalid_argument, "KVSTORE_SCHEDULER=\"" + *v + "\" is not host:port");
    scheduler_host = v->substr(0, colon);
    scheduler_port = env::parse_port("KVSTORE_SCHEDULER", v->substr(colon + 1));
  } else {
    if (auto h = env::first_of("DMLC_PS_ROOT_URI")) scheduler_host = *h;
    if (auto p = env::first_of("DMLC_PS_ROOT_PORT"))
      scheduler_port = env::parse_port("DMLC_PS_ROOT_PORT", *p);
  }
  if (auto v = env::first_of("KVSTORE_NUM_WORKERS", "DMLC_NUM_WORKER"))
    num_workers =
        env::parse_int(env::get("KVSTORE_NUM_WORKERS") ? "KVSTORE_NUM_WORKERS" : "DMLC_NUM_WORKER",
                       *v, 1, 1 << 16);
  if (auto v = env::first_of("KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER"))
    num_servers =
        env::parse_int(env::get("KVSTORE_NUM_SERVERS") ? "KVSTORE_NUM_SERVERS" : "DMLC_NUM_SERVER",
                       *v, 1, 1 << 16);
  if (auto v = env::first_of("KVSTORE_TYPE")) {
    if (*v == "dist_sync" || *v == "dist")
      sync = true;
    else if (*v == "dist_async")
      sync = false;
    else
      throw error(errc::invalid_argument,
                  "KVSTORE_TYPE=\"" + *v + "\": expected dist_sync or dist_async");
  }
  if (auto v = env::first_of("KVSTORE_COLOCATED")) {
    if (*v != "0" && *v != "1")
      throw error(errc::invalid_argument, "KVSTORE_COLOCATED=\"" + *v + "\": expected 0 or 1");
    colocated = *v == "1";
  }
  if (auto v = env::first_of("KVSTORE_TOKEN")) token = *v;
  if (auto v = env::first_of("KVSTORE_RANK"))
    rank_hint = env::parse_int("KVSTORE_RANK", *v, 0, 1 << 16);
  if (auto v = env::first_of("KVSTORE_ON_WORKER_DEATH")) {
    if (*v == "leave")
      on_worker_death = worker_death::leave_group;
    else if (*v == "fail")
      on_worker_death = worker_death::fail;
    else
      throw error(errc::invalid_argument,
                  "KVSTORE_ON_WORKER_DEATH=\"" + *v + "\": expected leave or fail");
  }
  // Limits in bytes or counts: a positive integer each (KVSTORE_MAX_TOTAL_BYTES may be 0: half
  // of physical memory).
  auto count = [](const char* name, auto& field, bool zero_ok = false) {
    if (auto v = env::first_of(name)) {
      char* end = nullptr;
      errno = 0;
      const auto x = std::strtoull(v->c_str(), &end, 10);
      if (v->empty() || *end != '\0' || errno == ERANGE || (x == 0 && !zero_ok) || (*v)[0] == '-' ||
          x > static_cast<unsigned long long>(
                  std::numeric_limits<std::remove_reference_t<decltype(field)>>::max()))
        throw error(errc::invalid_argument, std::string(name) + "=\"" + *v + "\" is not a " +
                                                (zero_ok ? "non-negative" : "positive") +
                                                " integer");
      field = static_cast<std::remove_reference_t<decltype(field)>>(x);
    }
  };
  count("KVSTORE_MAX_KEY_BYTES", max_key_bytes);
  count("KVSTORE_MAX_FRAME_BYTES", max_frame_bytes);
  count("KVSTORE_MAX_TOTAL_BYTES", max_total_bytes, true);
  count("KVSTORE_MAX_KEYS", max_keys);
  count("KVSTORE_MAX_QUEUED_BYTES", max_queued_bytes);
  count("KVSTORE_MAX_CONNECTIONS", max_connections);
  count("KVSTORE_MAX_PENDING_CONNECTIONS", max_pending_connections);
  count("KVSTORE_MAX_HELD_PULLS", max_held_pulls);
  count("KVSTORE_SERVER_THREADS", server_threads, true);
  count("KVSTORE_FUSE_BYTES", fuse_bytes, true);
  if (auto v = env::first_of("KVSTORE_PIPELINE_DEPTH"))
    pipeline_depth =
        static_cast<std::uint32_t>(env::parse_int("KVSTORE_PIPELINE_DEPTH", *v, 1, 0xffff));
  if (auto v = env::first_of("KVSTORE_TCP_CONGESTION")) tcp_congestion = *v;
  if (auto v = env::first_of("KVSTORE_FUSE_US"))
    fuse_time = std::chrono::microseconds(env::parse_int("KVSTORE_FUSE_US", *v, 0, 1'000'000));
  apply_staleness_env();
  if (auto v = env::first_of("KVSTORE_AUTH_BIND_ADDRESS")) {
    if (*v != "0" && *v != "1")
      throw error(errc::invalid_argument,
                  "KVSTORE_AUTH_BIND_ADDRESS=\"" + *v + "\": expected 0 or 1");
    auth_bind_address = *v == "1";
  }
  if (auto v = env::first_of("KVSTORE_CHECKPOINT_DIR")) checkpoint_dir = *v;
  if (auto v = env::first_of("KVSTORE_TLS_CERT")) tls_cert = *v;
  if (auto v = env::first_of("KVSTORE_TLS_KEY")) tls_key = *v;
  if (auto v = env::first_of("KVSTORE_TLS_CA")) tls_ca = *v;
  if (auto v = env::first_of("KVSTORE_CHECKPOINT_INTERVAL_MS"))
    checkpoint_interval =
        std::chrono::milliseconds(env::parse_int("KVSTORE_CHECKPOINT_INTERVAL_MS", *v, 0, 1 << 30));
  if (auto v = env::first_of("KVSTORE_CHECKPOINT_ROUNDS"))
    checkpoint_rounds =
        static_cast<std::uint64_t>(env::parse_int("KVSTORE_CHECKPOINT_ROUNDS", *v, 0, 1 << 30));
  if (auto v = env::first_of("KVSTORE_SERVER_RESTART_WAIT_MS"))
    server_restart_wait =
        std::chrono::milliseconds(env::parse_int("KVSTORE_SERVER_RESTART_WAIT_MS", *v, 0, 1 << 30));
  // Deadlines and liveness in milliseconds (fault tests and slow links tune them per process).
  auto ms = [](const char* name, std::chrono::milliseconds& field) {
    if (auto v = env::first_of(name))
      field = std::chrono::milliseconds(env::parse_int(name, *v, 1, 1 << 30));
  };
  ms("KVSTORE_CONNECT_TIMEOUT_MS", connect_timeout);
  ms("KVSTORE_REQUEST_TIMEOUT_MS", request_timeout);
  ms("KVSTORE_BARRIER_TIMEOUT_MS", barrier_timeout);
  ms("KVSTORE_HEARTBEAT_MS", heartbeat_interval);
  ms("KVSTORE_DEAD_TIMEOUT_MS", dead_timeout);
  if (auto v = env::first_of("KVSTORE_WAIT_SPIN_US"))
    wait_spin = std::chrono::microseconds(env::parse_int("KVSTORE_WAIT_SPIN_US", *v, 0, 1'000'000));
  if (auto v = env::first_of("KVSTORE_BIND")) bind_host = *v;
  if (auto v = env::first_of("KVSTORE_ADVERTISE")) advertise_host = *v;
  if (!role_given) apply_launcher_env();
  apply_colocated_env();
}

inline void dist_options::apply_colocated_env() {
  namespace env = detail::env;
  if (!colocated) return;
  if (auto v = env::first_of("KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER");
      v && num_servers != num_workers) {
    const char* name = env::get("KVSTORE_NUM_SERVERS") ? "KVSTORE_NUM_SERVERS" : "DMLC_NUM_SERVER";
    throw error(errc::invalid_argument,
                "KVSTORE_COLOCATED=1 puts one server in each of the job's " +
                    std::to_string(num_workers) + " workers, but " + name + "=" + *v +
                    " asks for " + std::to_string(num_servers) + " servers");
  }
  num_servers = num_workers;
  resolve_colocated();
}

inline void dist_options::apply_colocated_launcher(const launcher_rank& l) {
  namespace env = detail::env;
  if (env::first_of("KVSTORE_NUM_WORKERS", "DMLC_NUM_WORKER") && num_workers != l.size)
    throw error(
        errc::invalid_argument,
        std::string(env::get("KVSTORE_NUM_WORKERS") ? "KVSTORE_NUM_WORKERS" : "DMLC_NUM_WORKER") +
            "=" + std::to_string(num_workers) + " but " + l.source + " gives " +
            std::to_string(l.size) + " processes, each a worker of a colocated job");
  num_workers = l.size;
  role = kvstore::role::worker;
  rank_hint = l.rank;
  colocated_scheduler = l.rank == 0;
  apply_launcher_scheduler();
}

// KVSTORE_STALENESS: a non-negative count of pushes, or "unbounded".
inline void dist_options::apply_staleness_env() {
  auto v = detail::env::first_of("KVSTORE_STALENESS");
  if (!v) return;
  if (*v == "unbounded") {
    staleness.reset();
    return;
  }
  char* end = nullptr;
  errno = 0;
  const auto x = std::strtoull(v->c_str(), &end, 10);
  if (v->empty() || (*v)[0] < '0' || (*v)[0] > '9' || *end != '\0' || errno == ERANGE ||
      x > static_cast<unsigned long long>(std::numeric_limits<std::int64_t>::max()))
    throw error(
        errc::invalid_argument,
        "KVSTORE_STALENESS=\"" + *v + "\": expected a non-negative number of pushes, or unbounded");
  staleness = static_cast<std::uint64_t>(x);
}

inline void dist_options::apply_launcher_env() {
  namespace env = detail::env;
  auto l = env::launcher();
  if (l.rank < 0) return;
  if (colocated) return apply_colocated_launcher(l);
  const bool servers_given = env::first_of("KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER").has_value();
  if (!servers_given) num_servers = 1;
  if (l.size < num_servers + 2)
    throw error(errc::invalid_argument,
                std::string(l.source) + ": a job of " + std::to_string(l.size) +
                    " processes cannot hold a scheduler, " + std::to_string(num_servers) +
                    " server(s) and a worker");
  const int workers = l.size - 1 - num_servers;
  if (env::first_of("KVSTORE_NUM_WORKERS", "DMLC_NUM_WORKER") && num_workers != workers)
    throw error(
        errc::invalid_argument,
        std::string(env::get("KVSTORE_NUM_WORKERS") ? "KVSTORE_NUM_WORKERS" : "DMLC_NUM_WORKER") +
            "=" + std::to_string(num_workers) + " but " + l.source + " gives " +
            std::to_string(l.size) + " processes = 1 scheduler + " + std::to_string(num_servers) +
            " servers + " + std::to_string(workers) + " workers");
  num_workers = workers;
  if (l.rank == 0) {
    role = kvstore::role::scheduler;
  } else if (l.rank <= num_servers) {
    role = kvstore::role::server;
    rank_hint = l.rank - 1;
  } else {
    role = kvstore::role::worker;
    rank_hint = l.rank - 1 - num_servers;
  }
  apply_launcher_scheduler();
}

inline void dist_options::apply_launcher_scheduler() {
  namespace env = detail::env;
  if (!env::first_of("KVSTORE_SCHEDULER") && !env::first_of("DMLC_PS_ROOT_URI")) {
    if (auto a = env::first_of("MASTER_ADDR")) {
      scheduler_host = *a;
      if (auto p = env::first_of("MASTER_PORT"))
        scheduler_port = env::parse_port("MASTER_PORT", *p);
    } else if (auto nl = env::first_of("SLURM_JOB_NODELIST", "SLURM_NODELIST")) {
      scheduler_host = env::first_host(
          env::get("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST", *nl);
    }
  }
}

}  // namespace kvstore
