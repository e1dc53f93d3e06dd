// Minimal logging to stderr: one line per call, written at once so lines of threads don't mix.
// Info lines print only with KVSTORE_LOG set (and not 0); warnings (refused frames, dead nodes)
// always print.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace kvstore::detail {

inline bool log_info_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KVSTORE_LOG");
    return v && *v && *v != '0';
  }();
  return on;
}

inline void log_line(std::string_view who, std::string_view level, std::string_view msg) {
  std::string line;
  line.reserve(who.size() + level.size() + msg.size() + 16);
  line.append("kvstore ")
      .append(who)
      .append(" ")
      .append(level)
      .append(": ")
      .append(msg)
      .push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

inline void log_warn(std::string_view who, std::string_view msg) { log_line(who, "warning", msg); }
inline void log_info(std::string_view who, std::string_view msg) {
  if (log_info_enabled()) log_line(who, "info", msg);
}

}  // namespace kvstore::detail
