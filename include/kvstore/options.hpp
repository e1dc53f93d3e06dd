// Options structs: local_options for KVStore<local>, dist_options for KVStore<dist>, kv_server and
// kv_launch, with dist_options::from_env() reading the environment (KVSTORE_*, then DMLC_*).
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/transport/security.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace kvstore {

/// Options of KVStore<local>.
struct local_options {
  /// Threads of the engine's pool; 0 = the number of cores.
  unsigned threads = 0;
  /// Values of at least this many elements are reduced by all the pool's threads together.
  std::size_t parallel_reduce_min = std::size_t{1} << 16;
};

/// What the job does when a worker dies (its connection drops or it misses heartbeats for
/// dead_timeout): leave_group treats it as if it had called leave() (sync rounds and barriers
/// complete without it, a warning is logged); fail makes the rounds and barriers waiting for it
/// fail with an error naming it.
enum class worker_death { leave_group, fail };

/// Options of KVStore<dist> and of the server and scheduler loops.
struct dist_options {
  kvstore::role role = kvstore::role::worker;
  /// Where the scheduler listens (host and port).
  std::string scheduler_host = "127.0.0.1";
  std::uint16_t scheduler_port = 9091;
  int num_workers = 1;
  int num_servers = 1;
  /// true: dist_sync (a round's pushes of all workers are summed, then applied once);
  /// false: dist_async (each push applied on arrival).
  bool sync = true;
  /// Shared secret every node proves before it is heard. Empty: listen on loopback only.
  std::string token;
  /// Preferred rank among the node's role (kv_launch sets it); -1: assigned in arrival order.
  int rank_hint = -1;
  /// Address a server listens on; empty: 127.0.0.1 without a token, 0.0.0.0 with one.
  std::string bind_host;
  /// Address others use to reach this server; empty: the bind host, or 127.0.0.1 for 0.0.0.0.
  std::string advertise_host;

  /// Deadline to reach the scheduler and for the whole job to gather.
  std::chrono::milliseconds connect_timeout{30'000};
  /// Deadline of one request to a server (push ack, pull answer, init). In dist_sync a push is
  /// answered when all workers pushed, so this also bounds waiting for a slow worker.
  std::chrono::milliseconds request_timeout{120'000};
  /// Deadline of a barrier.
  std::chrono::milliseconds barrier_timeout{300'000};
  /// Heartbeat period of every node to the scheduler (heartbeats are always on).
  std::chrono::milliseconds heartbeat_interval{500};
  /// A node not heard from for this long is dead for the scheduler (and reported to the others).
  std::chrono::milliseconds dead_timeout{10'000};
  /// op::wait() on a worker polls for the answer this long (yielding the CPU between polls)
  /// before it sleeps. An answer within it reaches the waiting thread without a wake-up from
  /// sleep, which costs tens of microseconds on a virtual machine; 0 sleeps at once. The cost is
  /// CPU: a waiting thread stays runnable for up to this long per wait.
  std::chrono::microseconds wait_spin{200};

  /// A peer must prove the token within this long after connecting, or it is dropped.
  std::chrono::milliseconds handshake_timeout{5'000};
  /// A server or the scheduler drops a connection silent for this long (0: never). Workers and
  /// servers send heartbeats every heartbeat_interval, so only a stuck or rogue peer hits it.
  std::chrono::milliseconds idle_timeout{60'000};
  /// TLS for every connection when tls_cert is set: this node's certificate chain and key (PEM)
  /// and the CA that signs every node's certificate; peers are verified on both sides.
  /// KVSTORE_TLS_CERT, KVSTORE_TLS_KEY, KVSTORE_TLS_CA.
  std::string tls_cert, tls_key, tls_ca;
  /// Most connections a server or the scheduler holds at once; more are closed on accept.
  std::size_t max_connections = 4096;

  /// See worker_death. KVSTORE_ON_WORKER_DEATH=leave|fail.
  worker_death on_worker_death = worker_death::leave_group;

  /// Where a server keeps its snapshot (server-<rank>.snap); empty: no snapshots. A server
  /// started with a rank (KVSTORE_RANK) whose snapshot exists restores it before serving.
  std::string checkpoint_dir;
  /// A server snapshots its shard this often when it changed (0: not on a timer) ...
  std::chrono::milliseconds checkpoint_interval{0};
  /// ... and after this many completed rounds or async pushes (0: not by count); also after
  /// every init and set_optimizer, and when a worker calls checkpoint().
  std::uint64_t checkpoint_rounds = 0;
  /// How long a worker waits for a lost server to come back (restarted with the same rank,
  /// restoring its snapshot) before failing the requests to it; meanwhile they are held and
  /// re-sent once it is back. 0: fail them at once.
  std::chrono::milliseconds server_restart_wait{0};

  /// Values above this many bytes are sliced evenly over all servers.
  std::size_t slice_bytes = std::size_t{1} << 20;
  /// Payloads are sent in frames of at most this many bytes, so a later high-priority message
  /// overtakes a long low-priority transfer.
  std::size_t chunk_bytes = std::size_t{1} << 20;
  /// A frame whose header announces more than this is refused and its connection closed.
  std::size_t max_frame_bytes = std::size_t{1} << 30;
  /// The most bytes of one key a server holds (its slice); an init asking for more is refused,
  /// so one request cannot make a server allocate without bound. KVSTORE_MAX_KEY_BYTES.
  std::uint64_t max_key_bytes = std::uint64_t{8} << 30;
  /// Engine threads of a worker; 0 = the number of cores.
  unsigned threads = 0;
  /// Barrier with all workers when the store is destroyed.
  bool barrier_before_exit = true;

  /// The transport security of a connection this node accepts (acceptor) or opens.
  transport_security security(bool acceptor) const {
    transport_security s;
    s.token = token;
    s.acceptor = acceptor;
    s.handshake_timeout = handshake_timeout;
    s.idle_timeout = acceptor ? idle_timeout : std::chrono::milliseconds(0);
    s.tls_cert = tls_cert;
    s.tls_key = tls_key;
    s.tls_ca = tls_ca;
    return s;
  }

  /// "dist_sync" or "dist_async".
  std::string type_name() const { return sync ? "dist_sync" : "dist_async"; }

  /// Options from the environment: KVSTORE_ROLE | DMLC_ROLE, KVSTORE_SCHEDULER (host:port) |
  /// DMLC_PS_ROOT_URI + DMLC_PS_ROOT_PORT, KVSTORE_NUM_WORKERS | DMLC_NUM_WORKER,
  /// KVSTORE_NUM_SERVERS | DMLC_NUM_SERVER, KVSTORE_TYPE, KVSTORE_TOKEN, KVSTORE_RANK,
  /// KVSTORE_{CONNECT,REQUEST,BARRIER}_TIMEOUT_MS, KVSTORE_HEARTBEAT_MS, KVSTORE_DEAD_TIMEOUT_MS.
  /// Throws kvstore::error naming the variable whose value is malformed.
  static dist_options from_env() {
    dist_options o;
    o.apply_env();
    return o;
  }

  /// Overrides the fields named in the environment. Looked up in this order:
  ///  1. KVSTORE_* (role, scheduler, sizes, type, token, rank),
  ///  2. DMLC_* (dmlc-tracker / MXNet launch.py),
  ///  3. a launcher's rank when no role is given: OMPI_COMM_WORLD_RANK/SIZE (Open MPI),
  ///     PMI_RANK/SIZE (MPICH, Slurm PMI), SLURM_PROCID/NTASKS, RANK/WORLD_SIZE (torchrun).
  ///     Rank 0 is the scheduler, the next num_servers ranks servers, the rest workers; the
  ///     scheduler is MASTER_ADDR:MASTER_PORT, else the first host of SLURM_JOB_NODELIST,
  ///     else 127.0.0.1:9091, unless KVSTORE_SCHEDULER / DMLC_PS_ROOT_* say otherwise.
  void apply_env() {
    const bool role_given = env("KVSTORE_ROLE", "DMLC_ROLE").has_value();
    if (auto v = env("KVSTORE_ROLE", "DMLC_ROLE")) {
      const char* name = get("KVSTORE_ROLE") ? "KVSTORE_ROLE" : "DMLC_ROLE";
      try {
        role = parse_role(*v);
      } catch (const error& e) {
        throw error(errc::invalid_argument, std::string(name) + ": " + e.what());
      }
    }
    if (auto v = env("KVSTORE_SCHEDULER")) {
      auto colon = v->rfind(':');
      if (colon == std::string::npos || colon == 0)
        throw error(errc::invalid_argument,
                    "KVSTORE_SCHEDULER=\"" + *v + "\" is not host:port");
      scheduler_host = v->substr(0, colon);
      scheduler_port = parse_port("KVSTORE_SCHEDULER", v->substr(colon + 1));
    } else {
      if (auto h = env("DMLC_PS_ROOT_URI")) scheduler_host = *h;
      if (auto p = env("DMLC_PS_ROOT_PORT")) scheduler_port = parse_port("DMLC_PS_ROOT_PORT", *p);
    }
    if (auto v = env("KVSTORE_NUM_WORKERS", "DMLC_NUM_WORKER"))
      num_workers = parse_int(get("KVSTORE_NUM_WORKERS") ? "KVSTORE_NUM_WORKERS" : "DMLC_NUM_WORKER",
                              *v, 1, 1 << 16);
    if (auto v = env("KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER"))
      num_servers = parse_int(get("KVSTORE_NUM_SERVERS") ? "KVSTORE_NUM_SERVERS" : "DMLC_NUM_SERVER",
                              *v, 1, 1 << 16);
    if (auto v = env("KVSTORE_TYPE")) {
      if (*v == "dist_sync" || *v == "dist")
        sync = true;
      else if (*v == "dist_async")
        sync = false;
      else
        throw error(errc::invalid_argument,
                    "KVSTORE_TYPE=\"" + *v + "\": expected dist_sync or dist_async");
    }
    if (auto v = env("KVSTORE_TOKEN")) token = *v;
    if (auto v = env("KVSTORE_RANK")) rank_hint = parse_int("KVSTORE_RANK", *v, 0, 1 << 16);
    if (auto v = env("KVSTORE_ON_WORKER_DEATH")) {
      if (*v == "leave") on_worker_death = worker_death::leave_group;
      else if (*v == "fail") on_worker_death = worker_death::fail;
      else throw error(errc::invalid_argument, "KVSTORE_ON_WORKER_DEATH=\"" + *v + "\": expected leave or fail");
    }
    if (auto v = env("KVSTORE_MAX_KEY_BYTES")) {
      char* end = nullptr;
      const auto x = std::strtoull(v->c_str(), &end, 10);
      if (*end != '\0' || x == 0)
        throw error(errc::invalid_argument, "KVSTORE_MAX_KEY_BYTES=\"" + *v + "\" is not a positive integer");
      max_key_bytes = x;
    }
    if (auto v = env("KVSTORE_CHECKPOINT_DIR")) checkpoint_dir = *v;
    if (auto v = env("KVSTORE_TLS_CERT")) tls_cert = *v;
    if (auto v = env("KVSTORE_TLS_KEY")) tls_key = *v;
    if (auto v = env("KVSTORE_TLS_CA")) tls_ca = *v;
    if (auto v = env("KVSTORE_CHECKPOINT_INTERVAL_MS"))
      checkpoint_interval = std::chrono::milliseconds(parse_int("KVSTORE_CHECKPOINT_INTERVAL_MS", *v, 0, 1 << 30));
    if (auto v = env("KVSTORE_CHECKPOINT_ROUNDS"))
      checkpoint_rounds = static_cast<std::uint64_t>(parse_int("KVSTORE_CHECKPOINT_ROUNDS", *v, 0, 1 << 30));
    if (auto v = env("KVSTORE_SERVER_RESTART_WAIT_MS"))
      server_restart_wait = std::chrono::milliseconds(parse_int("KVSTORE_SERVER_RESTART_WAIT_MS", *v, 0, 1 << 30));
    // Deadlines and liveness in milliseconds (fault tests and slow links tune them per process).
    auto ms = [](const char* name, std::chrono::milliseconds& field) {
      if (auto v = env(name)) field = std::chrono::milliseconds(parse_int(name, *v, 1, 1 << 30));
    };
    ms("KVSTORE_CONNECT_TIMEOUT_MS", connect_timeout);
    ms("KVSTORE_REQUEST_TIMEOUT_MS", request_timeout);
    ms("KVSTORE_BARRIER_TIMEOUT_MS", barrier_timeout);
    ms("KVSTORE_HEARTBEAT_MS", heartbeat_interval);
    ms("KVSTORE_DEAD_TIMEOUT_MS", dead_timeout);
    if (auto v = env("KVSTORE_WAIT_SPIN_US"))
      wait_spin = std::chrono::microseconds(parse_int("KVSTORE_WAIT_SPIN_US", *v, 0, 1'000'000));
    if (auto v = env("KVSTORE_BIND")) bind_host = *v;
    if (auto v = env("KVSTORE_ADVERTISE")) advertise_host = *v;
    if (!role_given) apply_launcher_env();
  }

  /// The rank and size a launcher gave this process (mpirun, srun, torchrun), if any.
  struct launcher_rank {
    int rank = -1, size = 0;
    const char* source = nullptr;
  };
  static launcher_rank launcher() {
    static constexpr const char* pairs[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                               {"PMI_RANK", "PMI_SIZE"},
                                               {"PMIX_RANK", "PMIX_SIZE"},
                                               {"SLURM_PROCID", "SLURM_NTASKS"},
                                               {"RANK", "WORLD_SIZE"}};
    for (auto& p : pairs) {
      auto r = env(p[0]);
      auto n = env(p[1]);
      if (r && n) return {parse_int(p[0], *r, 0, 1 << 20), parse_int(p[1], *n, 1, 1 << 20), p[0]};
    }
    return {};
  }

 private:
  void apply_launcher_env() {
    auto l = launcher();
    if (l.rank < 0) return;
    const bool servers_given = env("KVSTORE_NUM_SERVERS", "DMLC_NUM_SERVER").has_value();
    if (!servers_given) num_servers = 1;
    if (l.size < num_servers + 2)
      throw error(errc::invalid_argument,
                  std::string(l.source) + ": a job of " + std::to_string(l.size) +
                      " processes cannot hold a scheduler, " + std::to_string(num_servers) +
                      " server(s) and a worker");
    const int workers = l.size - 1 - num_servers;
    if (env("KVSTORE_NUM_WORKERS", "DMLC_NUM_WORKER") && num_workers != workers)
      throw error(errc::invalid_argument,
                  std::string(get("KVSTORE_NUM_WORKERS") ? "KVSTORE_NUM_WORKERS" : "DMLC_NUM_WORKER") +
                      "=" + std::to_string(num_workers) + " but " + l.source +
                      " gives " + std::to_string(l.size) + " processes = 1 scheduler + " +
                      std::to_string(num_servers) + " servers + " + std::to_string(workers) +
                      " workers");
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
    if (!env("KVSTORE_SCHEDULER") && !env("DMLC_PS_ROOT_URI")) {
      if (auto a = env("MASTER_ADDR")) {
        scheduler_host = *a;
        if (auto p = env("MASTER_PORT")) scheduler_port = parse_port("MASTER_PORT", *p);
      } else if (auto nl = env("SLURM_JOB_NODELIST", "SLURM_NODELIST")) {
        scheduler_host = first_host(get("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST", *nl);
      }
    }
  }

  /// The first host of a Slurm node list: "a,b" -> a; "node[03-05,7]" -> node03;
  /// "rack[2-3]-n[01-04]" -> rack2-n01. Throws kvstore::error naming `var` when malformed.
  static std::string first_host(const char* var, const std::string& list) {
    auto bad = [&](const char* why) {
      return error(errc::invalid_argument, std::string(var) + "=\"" + list + "\": " + why);
    };
    std::string host;
    std::size_t i = 0;
    while (i < list.size() && list[i] != ',') {
      if (list[i] == ']') throw bad("a ']' without '['");
      if (list[i] != '[') {
        host += list[i++];
        continue;
      }
      const auto close = list.find(']', i);
      if (close == std::string::npos) throw bad("a '[' without ']'");
      const auto first = list.substr(i + 1, list.find_first_of(",-]", i + 1) - i - 1);
      if (first.empty()) throw bad("an empty range");
      host += first;
      i = close + 1;
    }
    if (host.empty()) throw bad("no first host");
    return host;
  }

 public:

  static kvstore::role parse_role(const std::string& v) {
    if (v == "worker") return kvstore::role::worker;
    if (v == "server") return kvstore::role::server;
    if (v == "scheduler") return kvstore::role::scheduler;
    throw error(errc::invalid_argument,
                "role \"" + v + "\": expected worker, server or scheduler");
  }

 private:
  static const char* get(const char* name) {
    const char* v = std::getenv(name);
    return (v && *v) ? v : nullptr;
  }
  // The first of the names that is set and non-empty.
  static std::optional<std::string> env(const char* a, const char* b = nullptr) {
    if (const char* v = get(a)) return std::string(v);
    if (b)
      if (const char* v = get(b)) return std::string(v);
    return std::nullopt;
  }
  static int parse_int(const char* what, const std::string& v, int lo, int hi) {
    char* end = nullptr;
    long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || x < lo || x > hi)
      throw error(errc::invalid_argument, std::string(what) + "=\"" + v +
                                              "\" is not an integer in [" + std::to_string(lo) +
                                              ", " + std::to_string(hi) + "]");
    return static_cast<int>(x);
  }
  static std::uint16_t parse_port(const char* what, const std::string& v) {
    return static_cast<std::uint16_t>(parse_int(what, v, 1, 65535));
  }
};

}  // namespace kvstore
