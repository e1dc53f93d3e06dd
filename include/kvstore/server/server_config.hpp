// What a server takes from dist_options before it serves: its accept loop's rules, its shard's
// config (held pulls' bounds and deadline, a memory bound by default) and its scheduler
// connection's frame limits. Apart from the node loop (server/server.hpp), so that each
// derivation has one place and the loop reads as the loop.
#pragma once

#include <unistd.h>
#include <kvstore/node.hpp>
#include <kvstore/options.hpp>
#include <kvstore/server/shard_config.hpp>
#include <kvstore/transport/node_base.hpp>
#include <kvstore/wire/frame.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace kvstore::detail {

inline transport::node_base::accept_rules accept_rules_of(const dist_options& o) {
  transport::node_base::accept_rules r;
  r.max_connections = o.max_connections;
  r.max_pending_connections = o.max_pending_connections;
  r.security = o.security(true);
  r.security.self = role::server;
  r.limits.max_payload = o.max_frame_bytes;
  r.gather_bytes = o.chunk_bytes;
  return r;
}
// Held pulls (versions, staleness): a held pull fails a little before the worker's own
// deadline, so the worker gets this server's reason (the key and what it waited for).
inline void held_config(const dist_options& o, detail::shard_config& c) {
  o.check_versions();
  c.staleness = o.staleness;
  c.max_held_pulls = o.max_held_pulls;
  c.max_held_bytes = o.max_queued_bytes;
  c.hold_timeout =
      o.request_timeout - std::min(o.request_timeout / 4, std::chrono::milliseconds(250));
}
// max_total_bytes' default: a server never takes more than half the machine on its peers' word.
inline std::uint64_t half_of_physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::uint64_t{8} << 30;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
}
inline detail::shard_config shard_config_of(const dist_options& o) {
  detail::shard_config c;
  c.sync = o.sync;
  c.num_workers = o.num_workers;
  c.chunk_bytes = o.chunk_bytes;
  c.max_frame_bytes = o.max_frame_bytes;
  c.max_key_bytes = o.max_key_bytes;
  c.apply_threads = o.server_threads;
  c.max_total_bytes = o.max_total_bytes ? o.max_total_bytes : half_of_physical_memory();
  c.max_keys = o.max_keys;
  held_config(o, c);
  return c;
}
inline wire::limits sched_limits() {
  wire::limits l;
  l.max_payload = 1 << 20;
  l.max_meta = 16 << 20;
  return l;
}

}  // namespace kvstore::detail
