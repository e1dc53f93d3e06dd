// Who is who in a distributed job: the role of a process, and node ids and groups numbered as
// ps-lite and MXNet number them (scheduler node 1, server rank r node 8 + 2r, worker rank r node
// 9 + 2r; groups 1 scheduler, 2 servers, 4 workers, summed). A base header: wire/, client/,
// server/ and rendezvous/ include it instead of options.hpp.
#pragma once

#include <string>

namespace kvstore {

/// The role of a process in a distributed job.
enum class role { worker, server, scheduler };

namespace detail {

inline constexpr int scheduler_id = 1;
inline constexpr int group_scheduler = 1;
inline constexpr int group_servers = 2;
inline constexpr int group_workers = 4;

inline int server_id(int rank) { return 8 + 2 * rank; }
inline int worker_id(int rank) { return 9 + 2 * rank; }

inline int group_of(role r) {
  switch (r) {
    case role::scheduler:
      return group_scheduler;
    case role::server:
      return group_servers;
    case role::worker:
      return group_workers;
  }
  return 0;
}

inline const char* role_name(role r) {
  switch (r) {
    case role::scheduler:
      return "scheduler";
    case role::server:
      return "server";
    case role::worker:
      return "worker";
  }
  return "?";
}

/// "server 1 (node 10)" / "worker 0 (node 9)" / "scheduler (node 1)".
inline std::string node_name(int id) {
  if (id == scheduler_id) return "scheduler (node 1)";
  if (id >= 8 && id % 2 == 0)
    return "server " + std::to_string((id - 8) / 2) + " (node " + std::to_string(id) + ")";
  if (id >= 9)
    return "worker " + std::to_string((id - 9) / 2) + " (node " + std::to_string(id) + ")";
  return "node " + std::to_string(id);
}

}  // namespace detail
}  // namespace kvstore
