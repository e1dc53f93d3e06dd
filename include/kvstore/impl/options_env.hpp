// dist_options::apply_env()'s body: the environment, in lookup order, onto the options' fields.
// Kept apart from options.hpp so the options structs read as a list of settings. The functions
// are templates over the options type so that this header needs nothing of options.hpp:
// options.hpp includes it and instantiates them with dist_options (dist_options::apply_env), and
// the include runs one way only.
#pragma once

#include <kvstore/detail/env.hpp>
#include <kvstore/error.hpp>
#include <kvstore/node.hpp>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

namespace kvstore::detail::options_env {

/// dist_options::apply_env() (see there): the environment onto `o`'s fields.
template <class Options>
void apply_env(Options& o);
// Role, sizes and scheduler from a launcher's rank when no role was given.
template <class Options>
void apply_launcher_env(Options& o);
// The same for a colocated job: every rank a worker, rank 0 also the scheduler.
template <class Options>
void apply_colocated_launcher(Options& o, const env::launcher_rank& l);
// The scheduler's address under a launcher (MASTER_ADDR, the Slurm node list).
template <class Options>
void apply_launcher_scheduler(Options& o);
// KVSTORE_COLOCATED's server count against the one the environment gave, if any.
template <class Options>
void apply_colocated_env(Options& o);
// KVSTORE_STALENESS.
template <class Options>
void apply_staleness_env(Options& o);

template <class Options>
void apply_env(Options& o) {
  const bool role_given = env::first_of("KVSTORE_ROLE", "DMLC_ROLE").has_value();
  if (auto v = env::first_of("KVSTORE_ROLE", "DMLC_ROLE")) {
    const char* name = env::get("KVSTORE_ROLE") ? "KVSTORE_ROLE" : "DMLC_ROLE";
    try {
      o.role = env::parse_role(*v);
    } catch (const error& e) {
      throw error(errc::invalid_argument, std::string(name) + ": " + e.what());
    }
  }
  if (auto v = env::first_of("KVSTORE_SCHEDULER")) {
    auto colon = v->rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw error(errc::invalid_argument, "KVSTORE_SCHEDULER=\"" + *v + "\" is not host:port");
    o.scheduler_host = v->substr(0, colon);
    o.scheduler_port = env::parse_port("KVSTORE_SCHEDULER", v->substr(colon + 1));
  } else {
    if (auto h = env::first_of("DMLC_PS_ROOT_URI")) o.scheduler_host = *h;
    if (auto p = env::first_of("DMLC_PS_ROOT_PORT"))
      o.scheduler_port = env::parse_port("DMLC_PS_ROOT_PORT", *p);
  }
  if (auto v = env::first_of("KVSTORE_NUM_WORKERS", "DMLC_NUM_WORKER"))
    o.num_workers =
        env::parse_int(env::get("KVSTORE_NUM_WORKERS") ? "KVSTORE_NUM_WORKERS" : "DMLC_NUM_WORKER",
                       *v, 1, 1 << 16);
  if (auto v = env::first_of("KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER"))
    o.num_servers =
        env::parse_int(env::get("KVSTORE_NUM_SERVERS") ? "KVSTORE_NUM_SERVERS" : "DMLC_NUM_SERVER",
                       *v, 1, 1 << 16);
  if (auto v = env::first_of("KVSTORE_TYPE")) {
    if (*v == "dist_sync" || *v == "dist")
      o.sync = true;
    else if (*v == "dist_async")
      o.sync = false;
    else
      throw error(errc::invalid_argument,
                  "KVSTORE_TYPE=\"" + *v + "\": expected dist_sync or dist_async");
  }
  if (auto v = env::first_of("KVSTORE_COLOCATED")) {
    if (*v != "0" && *v != "1")
      throw error(errc::invalid_argument, "KVSTORE_COLOCATED=\"" + *v + "\": expected 0 or 1");
    o.colocated = *v == "1";
  }
  if (auto v = env::first_of("KVSTORE_TOKEN")) o.token = *v;
  if (auto v = env::first_of("KVSTORE_RANK"))
    o.rank_hint = env::parse_int("KVSTORE_RANK", *v, 0, 1 << 16);
  if (auto v = env::first_of("KVSTORE_ON_WORKER_DEATH")) {
    if (*v == "leave")
      o.on_worker_death = decltype(o.on_worker_death)::leave_group;
    else if (*v == "fail")
      o.on_worker_death = decltype(o.on_worker_death)::fail;
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
  count("KVSTORE_MAX_KEY_BYTES", o.max_key_bytes);
  count("KVSTORE_MAX_FRAME_BYTES", o.max_frame_bytes);
  count("KVSTORE_MAX_TOTAL_BYTES", o.max_total_bytes, true);
  count("KVSTORE_MAX_KEYS", o.max_keys);
  count("KVSTORE_MAX_QUEUED_BYTES", o.max_queued_bytes);
  count("KVSTORE_MAX_CONNECTIONS", o.max_connections);
  count("KVSTORE_MAX_PENDING_CONNECTIONS", o.max_pending_connections);
  count("KVSTORE_MAX_HELD_PULLS", o.max_held_pulls);
  count("KVSTORE_SERVER_THREADS", o.server_threads, true);
  count("KVSTORE_FUSE_BYTES", o.fuse_bytes, true);
  if (auto v = env::first_of("KVSTORE_PIPELINE_DEPTH"))
    o.pipeline_depth =
        static_cast<std::uint32_t>(env::parse_int("KVSTORE_PIPELINE_DEPTH", *v, 1, 0xffff));
  if (auto v = env::first_of("KVSTORE_TCP_CONGESTION")) o.tcp_congestion = *v;
  if (auto v = env::first_of("KVSTORE_FUSE_US"))
    o.fuse_time = std::chrono::microseconds(env::parse_int("KVSTORE_FUSE_US", *v, 0, 1'000'000));
  apply_staleness_env(o);
  if (auto v = env::first_of("KVSTORE_AUTH_BIND_ADDRESS")) {
    if (*v != "0" && *v != "1")
      throw error(errc::invalid_argument,
                  "KVSTORE_AUTH_BIND_ADDRESS=\"" + *v + "\": expected 0 or 1");
    o.auth_bind_address = *v == "1";
  }
  if (auto v = env::first_of("KVSTORE_CHECKPOINT_DIR")) o.checkpoint_dir = *v;
  if (auto v = env::first_of("KVSTORE_TLS_CERT")) o.tls_cert = *v;
  if (auto v = env::first_of("KVSTORE_TLS_KEY")) o.tls_key = *v;
  if (auto v = env::first_of("KVSTORE_TLS_CA")) o.tls_ca = *v;
  if (auto v = env::first_of("KVSTORE_CHECKPOINT_INTERVAL_MS"))
    o.checkpoint_interval =
        std::chrono::milliseconds(env::parse_int("KVSTORE_CHECKPOINT_INTERVAL_MS", *v, 0, 1 << 30));
  if (auto v = env::first_of("KVSTORE_CHECKPOINT_ROUNDS"))
    o.checkpoint_rounds =
        static_cast<std::uint64_t>(env::parse_int("KVSTORE_CHECKPOINT_ROUNDS", *v, 0, 1 << 30));
  if (auto v = env::first_of("KVSTORE_SERVER_RESTART_WAIT_MS"))
    o.server_restart_wait =
        std::chrono::milliseconds(env::parse_int("KVSTORE_SERVER_RESTART_WAIT_MS", *v, 0, 1 << 30));
  // Deadlines and liveness in milliseconds (fault tests and slow links tune them per process).
  auto ms = [](const char* name, std::chrono::milliseconds& field) {
    if (auto v = env::first_of(name))
      field = std::chrono::milliseconds(env::parse_int(name, *v, 1, 1 << 30));
  };
  ms("KVSTORE_CONNECT_TIMEOUT_MS", o.connect_timeout);
  ms("KVSTORE_REQUEST_TIMEOUT_MS", o.request_timeout);
  ms("KVSTORE_BARRIER_TIMEOUT_MS", o.barrier_timeout);
  ms("KVSTORE_HEARTBEAT_MS", o.heartbeat_interval);
  ms("KVSTORE_DEAD_TIMEOUT_MS", o.dead_timeout);
  if (auto v = env::first_of("KVSTORE_WAIT_SPIN_US"))
    o.wait_spin =
        std::chrono::microseconds(env::parse_int("KVSTORE_WAIT_SPIN_US", *v, 0, 1'000'000));
  if (auto v = env::first_of("KVSTORE_BIND")) o.bind_host = *v;
  if (auto v = env::first_of("KVSTORE_ADVERTISE")) o.advertise_host = *v;
  if (!role_given) apply_launcher_env(o);
  apply_colocated_env(o);
}

template <class Options>
void apply_colocated_env(Options& o) {
  if (!o.colocated) return;
  if (auto v = env::first_of("KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER");
      v && o.num_servers != o.num_workers) {
    const char* name = env::get("KVSTORE_NUM_SERVERS") ? "KVSTORE_NUM_SERVERS" : "DMLC_NUM_SERVER";
    throw error(errc::invalid_argument,
                "KVSTORE_COLOCATED=1 puts one server in each of the job's " +
                    std::to_string(o.num_workers) + " workers, but " + name + "=" + *v +
                    " asks for " + std::to_string(o.num_servers) + " servers");
  }
  o.num_servers = o.num_workers;
  o.resolve_colocated();
}

template <class Options>
void apply_colocated_launcher(Options& o, const env::launcher_rank& l) {
  if (env::first_of("KVSTORE_NUM_WORKERS", "DMLC_NUM_WORKER") && o.num_workers != l.size)
    throw error(
        errc::invalid_argument,
        std::string(env::get("KVSTORE_NUM_WORKERS") ? "KVSTORE_NUM_WORKERS" : "DMLC_NUM_WORKER") +
            "=" + std::to_string(o.num_workers) + " but " + l.source + " gives " +
            std::to_string(l.size) + " processes, each a worker of a colocated job");
  o.num_workers = l.size;
  o.role = kvstore::role::worker;
  o.rank_hint = l.rank;
  o.colocated_scheduler = l.rank == 0;
  apply_launcher_scheduler(o);
}

// KVSTORE_STALENESS: a non-negative count of pushes, or "unbounded".
template <class Options>
void apply_staleness_env(Options& o) {
  auto v = detail::env::first_of("KVSTORE_STALENESS");
  if (!v) return;
  if (*v == "unbounded") {
    o.staleness.reset();
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
  o.staleness = static_cast<std::uint64_t>(x);
}

template <class Options>
void apply_launcher_env(Options& o) {
  auto l = env::launcher();
  if (l.rank < 0) return;
  if (o.colocated) return apply_colocated_launcher(o, l);
  const bool servers_given = env::first_of("KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER").has_value();
  if (!servers_given) o.num_servers = 1;
  if (l.size < o.num_servers + 2)
    throw error(errc::invalid_argument,
                std::string(l.source) + ": a job of " + std::to_string(l.size) +
                    " processes cannot hold a scheduler, " + std::to_string(o.num_servers) +
                    " server(s) and a worker");
  const int workers = l.size - 1 - o.num_servers;
  if (env::first_of("KVSTORE_NUM_WORKERS", "DMLC_NUM_WORKER") && o.num_workers != workers)
    throw error(
        errc::invalid_argument,
        std::string(env::get("KVSTORE_NUM_WORKERS") ? "KVSTORE_NUM_WORKERS" : "DMLC_NUM_WORKER") +
            "=" + std::to_string(o.num_workers) + " but " + l.source + " gives " +
            std::to_string(l.size) + " processes = 1 scheduler + " + std::to_string(o.num_servers) +
            " servers + " + std::to_string(workers) + " workers");
  o.num_workers = workers;
  if (l.rank == 0) {
    o.role = kvstore::role::scheduler;
  } else if (l.rank <= o.num_servers) {
    o.role = kvstore::role::server;
    o.rank_hint = l.rank - 1;
  } else {
    o.role = kvstore::role::worker;
    o.rank_hint = l.rank - 1 - o.num_servers;
  }
  apply_launcher_scheduler(o);
}

template <class Options>
void apply_launcher_scheduler(Options& o) {
  if (!env::first_of("KVSTORE_SCHEDULER") && !env::first_of("DMLC_PS_ROOT_URI")) {
    if (auto a = env::first_of("MASTER_ADDR")) {
      o.scheduler_host = *a;
      if (auto p = env::first_of("MASTER_PORT"))
        o.scheduler_port = env::parse_port("MASTER_PORT", *p);
    } else if (auto nl = env::first_of("SLURM_JOB_NODELIST", "SLURM_NODELIST")) {
      o.scheduler_host = env::first_host(
          env::get("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST", *nl);
    }
  }
}

}  // namespace kvstore::detail::options_env
