// Options structs: local_options for KVStore<local>, dist_options for KVStore<dist>, kv_server and
// kv_launch, with dist_options::from_env() reading the environment (KVSTORE_*, then DMLC_*).
#pragma once

#include <kvstore/detail/env.hpp>
#include <kvstore/error.hpp>
#include <kvstore/impl/options_env.hpp>
#include <kvstore/node.hpp>
#include <kvstore/transport/security.hpp>

#include <chrono>
#include <cmath>
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

/// Gradient compression on the wire (dist; local values do not travel, and the call changes
/// nothing there). `type` is one of the unscoped names below, so `compression::bf16` reads as in
/// MXNet's set_gradient_compression: fp16 (IEEE half, round to nearest even), bf16 (round to
/// nearest even), bf16_trunc (the high 16 bits of the float: BigDL's "fp16"), two_bit (MXNet's
/// 2-bit quantization with a per-worker residual; pushes only, +-threshold or 0 per element).
struct compression {
  enum kind : std::uint8_t { none = 0, fp16 = 1, bf16 = 2, bf16_trunc = 3, two_bit = 4 };
  kind type = none;
  /// two_bit only: elements whose accumulated value reaches +-threshold are sent as +-threshold.
  float threshold = 0.5f;
};

namespace detail {
/// A compression's type must be one of compression::kind, and two_bit's threshold finite and
/// > 0: else error(invalid_argument) "kvstore: <where>: ..." naming the option.
inline void check_compression(const compression& c, const std::string& where) {
  if (c.type > compression::two_bit)
    throw error(errc::invalid_argument, "kvstore: " + where + ": compression type " +
                                            std::to_string(int{c.type}) +
                                            " is not one of none, fp16, bf16, bf16_trunc, two_bit");
  if (c.type == compression::two_bit && !(std::isfinite(c.threshold) && c.threshold > 0))
    throw error(errc::invalid_argument, "kvstore: " + where + ": two_bit threshold " +
                                            std::to_string(c.threshold) +
                                            " must be finite and greater than 0");
}
}  // namespace detail

/// How a dist key's elements are placed on the servers: hashed (one server, or sliced evenly over
/// all servers above slice_bytes: the default) or even (always sliced over all S servers, chunk i
/// starting at i*floor(n/S) + min(i, n mod S) with length floor(n/S) + (i < n mod S): BigDL's
/// rule).
enum class partition : std::uint8_t { hashed = 0, even = 1 };

/// Options of one key's init. An aggregate in this order: row_length (0: a vector; else a matrix
/// of size/row_length rows), partition, compression (this key's, over the store's
/// set_gradient_compression; type none: the store's setting).
struct init_options {
  std::size_t row_length = 0;
  kvstore::partition partition = kvstore::partition::hashed;
  kvstore::compression compression{};
};

/// Options of one pull: its priority, and the version the key must have reached (dist: rounds
/// completed in dist_sync, pushes applied in dist_async) before the value is read.
struct pull_options {
  int priority = 0;
  std::uint64_t min_version = 0;
};

/// Per-key multipliers of the optimizer's learning rate and weight decay (MXNet's lr_mult and
/// wd_mult, SINGA's learning_rate_multiplier).
struct key_options {
  double lr_mult = 1.0;
  double wd_mult = 1.0;
};

/// What the job does when a worker dies (its connection drops or it misses heartbeats for
/// dead_timeout): leave_group treats it as if it had called leave() (sync rounds and barriers
/// complete without it, a warning is logged); fail makes the rounds and barriers waiting for it
/// fail with an error naming it.
enum class worker_death { leave_group, fail };

/// Part of dist_options: who this process is in which job: its role, the job's sizes and layout,
/// its rounds, its threads.
struct job_options {
  kvstore::role role = kvstore::role::worker;
  /// Where the scheduler listens (host and port).
  std::string scheduler_host = "127.0.0.1";
  std::uint16_t scheduler_port = 9091;
  int num_workers = 1;
  int num_servers = 1;
  /// true: dist_sync (a round's pushes of all workers are summed, then applied once);
  /// false: dist_async (each push applied on arrival).
  bool sync = true;
  /// Preferred rank among the node's role (kv_launch sets it); -1: assigned in arrival order.
  int rank_hint = -1;
  /// See worker_death. KVSTORE_ON_WORKER_DEATH=leave|fail.
  worker_death on_worker_death = worker_death::leave_group;
  /// Colocated servers (BigDL's layout): every worker process also serves one shard on its own
  /// threads, its server rank equal to its worker rank, so the job has as many servers as workers
  /// and no server processes. A worker process that dies takes its shard with it.
  /// KVSTORE_COLOCATED=1; kv_launch --colocated; under a launcher (mpirun, srun, torchrun) every
  /// process is then a worker and rank 0 also runs the scheduler. See resolve_colocated().
  bool colocated = false;
  /// With colocated: this worker process also runs the job's scheduler on its own thread, at
  /// scheduler_host:scheduler_port (set for rank 0 of a colocated launch under a launcher).
  bool colocated_scheduler = false;
  /// dist_async only: a worker's pull of a key waits until every worker still in the group
  /// (not left, not dead) has pushed that key at least (this worker's own pushes of it) -
  /// staleness times; 0: every read sees all workers' pushes up to its own count. nullopt:
  /// unbounded (the default, plain async). In dist_sync every push already waits for its round,
  /// so no worker is ever ahead and staleness changes nothing. Servers apply it, so the job's
  /// servers and workers must agree (as on KVSTORE_TYPE). KVSTORE_STALENESS=N|unbounded.
  std::optional<std::uint64_t> staleness;
  /// Engine threads of a worker; 0 = the number of cores.
  unsigned threads = 0;
  /// Threads a server applies an element-wise optimizer (sgd, adam, adagrad, add) to a value of
  /// 512 Ki elements or more with, its io thread included; 0 = the number of cores, 1 = the io
  /// thread alone. A batched push of 2,048 keys or more (a multi-key push of small keys, seen
  /// before) is also served on them, in runs of consecutive keys: with 2 or more, or with 0 on a
  /// machine of 4 cores or more. KVSTORE_SERVER_THREADS.
  unsigned server_threads = 0;
  /// Barrier with all workers when the store is destroyed.
  bool barrier_before_exit = true;
};

/// Part of dist_options: how nodes reach and watch each other: addresses, deadlines, heartbeats,
/// waiting.
struct connection_options {
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
  /// The TCP congestion control of every connection this node opens or accepts. "auto" (the
  /// default): connections over loopback (127.0.0.0/8, ::1) run cubic, others the host's default.
  /// On loopback there is no link to share, and a host default of BBR without the fq qdisc makes
  /// the kernel pace each socket with a timer, which halved streamed 64 KiB pushes and pulls
  /// (the README's numbers). "system": the host's default everywhere. Any other value: that
  /// congestion control on every connection (e.g. "cubic", "dctcp"); one this process may not
  /// use (net.ipv4.tcp_allowed_congestion_control) is kvstore::error(invalid_argument) at start.
  /// KVSTORE_TCP_CONGESTION.
  std::string tcp_congestion = "auto";
};

/// Part of dist_options: how a node proves itself: the token, TLS, the address its proof covers.
struct security_options {
  /// Shared secret every node proves before it is heard. Empty: listen on loopback only.
  std::string token;
  /// TLS for every connection when tls_cert is set: this node's certificate chain and key (PEM)
  /// and the CA that signs every node's certificate; peers are verified on both sides.
  /// KVSTORE_TLS_CERT, KVSTORE_TLS_KEY, KVSTORE_TLS_CA.
  std::string tls_cert, tls_key, tls_ca;
  /// The authentication proof covers the connecting side's address and port as both ends see
  /// them, so a proof relayed through another connection is refused. Turn off only behind NAT
  /// that rewrites source addresses (and use TLS there). KVSTORE_AUTH_BIND_ADDRESS=0|1.
  bool auth_bind_address = true;
};

/// Part of dist_options: what a server or the scheduler accepts at most from its peers.
struct limit_options {
  /// Most authenticated connections a server or the scheduler holds at once; more are closed on
  /// accept. Never above what the process's descriptor limit allows: at start a node raises its
  /// soft RLIMIT_NOFILE to the hard limit and caps this below it. KVSTORE_MAX_CONNECTIONS.
  std::size_t max_connections = 4096;
  /// Connections that have not proven the token yet live in their own small pool (tiny read
  /// buffer, handshake_timeout): a flood of them evicts the oldest of its own kind and never
  /// keeps an authenticated peer out. KVSTORE_MAX_PENDING_CONNECTIONS.
  std::size_t max_pending_connections = 64;
  /// A frame whose header announces more than this is refused and its connection closed. Its
  /// buffer grows as the bytes arrive, never on the header's word. KVSTORE_MAX_FRAME_BYTES.
  std::size_t max_frame_bytes = std::size_t{64} << 20;
  /// The most bytes of one key a server holds (its slice); an init asking for more is refused,
  /// so one request cannot make a server allocate without bound. KVSTORE_MAX_KEY_BYTES.
  std::uint64_t max_key_bytes = std::uint64_t{8} << 30;
  /// The most bytes of all keys a server holds together (each key also counts what its record
  /// costs the server: 624 bytes with GCC on x86-64); an init past it is refused. 0: half of
  /// the machine's physical memory.
  /// KVSTORE_MAX_TOTAL_BYTES.
  std::uint64_t max_total_bytes = 0;
  /// The most keys a server holds; an init of one more is refused. KVSTORE_MAX_KEYS.
  std::uint64_t max_keys = std::uint64_t{1} << 24;
  /// Answers queued for one peer and not yet taken by its socket, in bytes: above this a server
  /// or the scheduler stops reading that peer's requests until it reads its answers
  /// (back-pressure), so a peer that never reads cannot grow a server. KVSTORE_MAX_QUEUED_BYTES.
  std::size_t max_queued_bytes = std::size_t{64} << 20;
  /// The most pulls of one worker a server holds at once, waiting for a version
  /// (pull_options::min_version) or for slower workers (staleness); more are refused with an
  /// error. Their row lists (pull_rows) count against max_queued_bytes. KVSTORE_MAX_HELD_PULLS.
  std::size_t max_held_pulls = 4096;
};

/// Part of dist_options: how a worker cuts, fuses and streams its requests.
struct pipeline_options {
  /// Values above this many bytes are sliced evenly over all servers.
  std::size_t slice_bytes = std::size_t{1} << 20;
  /// Payloads are sent in frames of at most this many bytes, so a later high-priority message
  /// overtakes a long low-priority transfer.
  std::size_t chunk_bytes = std::size_t{1} << 20;
  /// Small-key fusion across calls: while something is in flight to a server, one-key pushes of
  /// small plain keys to it wait up to fuse_time and go out together in one frame of at most
  /// fuse_bytes (answered key by key, so no key's op waits for another's round). A push behind
  /// an op of its own key still on the wire is not fused: it streams (pipeline_depth).
  /// 64 KiB by default; 0 turns it off. Off while server_restart_wait is set (a fused frame is
  /// not kept for a re-send). With nothing in flight to the server a push goes at once;
  /// op::wait, wait, wait_all and barrier send what waits, so a waiting caller never pays
  /// fuse_time; and any later request to that server sends it first, so none overtakes it.
  /// KVSTORE_FUSE_BYTES, KVSTORE_FUSE_US.
  std::size_t fuse_bytes = std::size_t{64} << 10;
  std::chrono::microseconds fuse_time{100};
  /// Per-key pipelining: how many one-key pushes and pulls of one key may be on the wire before
  /// the first is answered. Ops on a key still take effect in issue order (one connection per
  /// server keeps it, and a server holds a worker's next push or pull of a key until its open
  /// sync round completes), but back-to-back ops stream instead of paying a round trip each. 1:
  /// each op waits for the previous one's answer. Only ops of one priority stream behind each
  /// other (a connection sends higher priorities first). Only values of at most 64 KiB (and
  /// chunk_bytes) travelling plain pipeline (servers keep what is sent ahead of an open round,
  /// within max_queued_bytes per worker); not while server_restart_wait is set (a re-send could
  /// reorder them), nor pulls servers may hold for staleness (a push fusion holds back keeps its
  /// key until answered; one behind its key's op on the wire streams). KVSTORE_PIPELINE_DEPTH.
  std::uint32_t pipeline_depth = 16;
};

/// Part of dist_options: snapshots, and how long a worker waits for a restarted server.
struct recovery_options {
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
};

/// Options of KVStore<dist> and of the server and scheduler loops: the parts above, one per
/// concern, in one struct. Every field is named directly (opts.max_keys, opts.token); code that
/// needs one concern takes its part (a dist_options binds to a const limit_options&).
struct dist_options : job_options,
                      connection_options,
                      security_options,
                      limit_options,
                      pipeline_options,
                      recovery_options {
  /// Throws kvstore::error naming the option whose value cannot be right (a staleness above
  /// 2^63: a negative number converted to unsigned; more than 1024 server_threads).
  void check_versions() const {
    if (staleness && *staleness > static_cast<std::uint64_t>(INT64_MAX))
      throw error(errc::invalid_argument,
                  "dist_options::staleness = " + std::to_string(*staleness) +
                      " is not a count of pushes (a negative value converted to unsigned?)");
    if (max_held_pulls == 0)
      throw error(errc::invalid_argument, "dist_options::max_held_pulls is 0");
    if (server_threads > 1024)
      throw error(errc::invalid_argument,
                  "dist_options::server_threads = " + std::to_string(server_threads) +
                      ": more than 1024 threads per server");
  }
  /// The transport security of a connection this node accepts (acceptor) or opens to a node of
  /// role `peer` (which the peer must prove).
  transport_security security(bool acceptor,
                              std::optional<kvstore::role> peer = std::nullopt) const {
    transport_security s;
    s.token = token;
    s.acceptor = acceptor;
    s.self = role;
    s.expect_peer = peer;
    s.handshake_timeout = handshake_timeout;
    s.idle_timeout = acceptor ? idle_timeout : std::chrono::milliseconds(0);
    s.tls_cert = tls_cert;
    s.tls_key = tls_key;
    s.tls_ca = tls_ca;
    s.bind_address = auth_bind_address;
    s.max_queued_bytes = acceptor ? max_queued_bytes : 0;
    s.tcp_congestion = tcp_congestion;
    return s;
  }

  /// With colocated, the job's server count is its worker count: num_servers left at its default
  /// (1) becomes num_workers; another value that differs is kvstore::error(invalid_argument)
  /// naming both, and so is a server role (the servers run inside the workers). Nothing without
  /// colocated. from_env() and KVStore<dist> call it.
  void resolve_colocated() {
    if (!colocated) return;
    if (role == kvstore::role::server)
      throw error(errc::invalid_argument,
                  "colocated (KVSTORE_COLOCATED=1): every worker serves its own shard, so the job "
                  "has no server processes, but this process's role is server");
    if (num_servers == num_workers) return;
    if (num_servers != 1)
      throw error(errc::invalid_argument,
                  "colocated (KVSTORE_COLOCATED=1): a job of " + std::to_string(num_workers) +
                      " workers has " + std::to_string(num_workers) +
                      " servers, one in each worker, but num_servers (KVSTORE_NUM_SERVERS) is " +
                      std::to_string(num_servers));
    num_servers = num_workers;
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
  ///     else 127.0.0.1:9091, unless KVSTORE_SCHEDULER / DMLC_PS_ROOT_* say otherwise. With
  ///     KVSTORE_COLOCATED=1 every rank is a worker (rank = launcher rank) and rank 0 also runs
  ///     the scheduler.
  /// The body is impl/options_env.hpp's.
  void apply_env() { detail::options_env::apply_env(*this); }

  /// The rank and size a launcher gave this process (mpirun, srun, torchrun), if any.
  using launcher_rank = detail::env::launcher_rank;
  static launcher_rank launcher() { return detail::env::launcher(); }
  /// "worker", "server" or "scheduler"; anything else is an error.
  static kvstore::role parse_role(const std::string& v) { return detail::env::parse_role(v); }
};

}  // namespace kvstore
