// MXNet's kvstore names, read as its KVStore::Create reads them (src/kvstore/kvstore.cc): in any
// letter case, a name containing "dist" is a dist worker, dist_async only when it also contains
// "_async"; else one containing "device" or "nccl" is the device store; else one containing
// "local" is the local store. The one deviation: a name with none of those words is an error,
// where MXNet makes a local store of it (a typo would train alone, silently).
#pragma once

#include <kvstore/error.hpp>

#include <cctype>
#include <string>
#include <string_view>

namespace kvstore::compat::mxnet::detail {

/// MXNet's kvstore types, in the order error messages list them.
inline constexpr std::string_view type_names[] = {
    "local",     "local_allreduce_cpu", "local_allreduce_device", "device",          "nccl", "dist",
    "dist_sync", "dist_async",          "dist_device_sync",       "dist_sync_device"};

/// What a name asks for.
struct store_name {
  enum class store { local, device, dist } kind = store::local;
  bool sync = true;  // dist: dist_sync unless the name says "_async"
  std::string type;  // the name in lower case: MXNet's type()
};

/// Throws kvstore::error(invalid_argument) for a name with none of the words, listing the types.
inline store_name read_store_name(std::string_view name) {
  store_name n;
  n.type = std::string(name);
  for (char& c : n.type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto has = [&](std::string_view w) { return n.type.find(w) != std::string::npos; };
  if (has("dist")) {
    n.kind = store_name::store::dist;
    n.sync = !has("_async");
  } else if (has("device") || has("nccl")) {
    n.kind = store_name::store::device;
  } else if (!has("local")) {
    std::string valid;
    for (auto t : type_names) valid += (valid.empty() ? "" : ", ") + std::string(t);
    throw error(errc::invalid_argument, "kvstore: mxnet::KVStore::create(\"" + std::string(name) +
                                            "\"): unknown type (a name says local, device or "
                                            "dist); the types are " +
                                            valid);
  }
  return n;
}

}  // namespace kvstore::compat::mxnet::detail
