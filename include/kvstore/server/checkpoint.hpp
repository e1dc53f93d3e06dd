// Where a server's snapshot lives and how it reaches the disk: one file per server rank in the
// checkpoint directory, written atomically (temp file, fsync, rename, fsync of the directory) and
// read whole. The bytes are wire/snapshot.hpp's; what the shard puts in them,
// server/snapshots.hpp's.
#pragma once

#include <kvstore/detail/atomic_file.hpp>
#include <kvstore/wire/snapshot.hpp>

#include <filesystem>
#include <string>

namespace kvstore::detail {

using wire::part_snapshot;
using wire::shard_snapshot;
using wire::slice_header;
using wire::slice_snapshot;

/// The file name of server `rank`'s snapshot in `dir`.
inline std::filesystem::path snapshot_path(const std::filesystem::path& dir, int rank) {
  return dir / ("server-" + std::to_string(rank) + ".snap");
}

/// Writes `s` to `path` atomically. Throws kvstore::error on I/O failure.
inline void save_snapshot(const std::filesystem::path& path, const shard_snapshot& s) {
  write_file_atomically(path, wire::encode_snapshot(s));
}

/// Reads and checks the snapshot at `path`. Throws kvstore::error(bad_file) when it is not a
/// whole, valid snapshot.
inline shard_snapshot load_snapshot(const std::filesystem::path& path) {
  return wire::decode_snapshot(read_file(path), path.string());
}

}  // namespace kvstore::detail
