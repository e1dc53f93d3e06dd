// Reading the environment: variables that are set and non-empty, integers and ports in a range,
// a role's name, a Slurm node list's first host, and the rank a launcher gave this process.
// Errors are kvstore::error(invalid_argument) naming the variable and its value.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/node.hpp>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace kvstore::detail::env {

/// The variable's value, or nullptr when it is unset or empty.
inline const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}
/// The first of the names that is set and non-empty.
inline std::optional<std::string> first_of(const char* a, const char* b = nullptr) {
  if (const char* v = get(a)) return std::string(v);
  if (b)
    if (const char* v = get(b)) return std::string(v);
  return std::nullopt;
}
inline int parse_int(const char* what, const std::string& v, int lo, int hi) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > hi)
    throw error(errc::invalid_argument, std::string(what) + "=\"" + v +
                                            "\" is not an integer in [" + std::to_string(lo) +
                                            ", " + std::to_string(hi) + "]");
  return static_cast<int>(x);
}
inline std::uint16_t parse_port(const char* what, const std::string& v) {
  return static_cast<std::uint16_t>(parse_int(what, v, 1, 65535));
}

inline kvstore::role parse_role(const std::string& v) {
  if (v == "worker") return kvstore::role::worker;
  if (v == "server") return kvstore::role::server;
  if (v == "scheduler") return kvstore::role::scheduler;
  throw error(errc::invalid_argument, "role \"" + v + "\": expected worker, server or scheduler");
}

/// The first host of a Slurm node list: "a,b" -> a; "node[03-05,7]" -> node03;
/// "rack[2-3]-n[01-04]" -> rack2-n01. Throws kvstore::error naming `var` when malformed.
inline std::string first_host(const char* var, const std::string& list) {
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

/// The rank and size a launcher gave this process (mpirun, srun, torchrun), if any.
struct launcher_rank {
  int rank = -1, size = 0;
  const char* source = nullptr;
};
inline launcher_rank launcher() {
  static constexpr const char* pairs[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                             {"PMI_RANK", "PMI_SIZE"},
                                             {"PMIX_RANK", "PMIX_SIZE"},
                                             {"SLURM_PROCID", "SLURM_NTASKS"},
                                             {"RANK", "WORLD_SIZE"}};
  for (auto& p : pairs) {
    auto r = first_of(p[0]);
    auto n = first_of(p[1]);
    if (r && n) return {parse_int(p[0], *r, 0, 1 << 20), parse_int(p[1], *n, 1, 1 << 20), p[0]};
  }
  return {};
}

}  // namespace kvstore::detail::env
