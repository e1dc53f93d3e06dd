// The bytes of a server's snapshot file: every key slice (metadata, value, round, optimizer
// state, exactly-once bookkeeping) and the optimizer, as one versioned, checksummed encode/decode
// pair. Decoding checks everything before returning: a wrong, truncated or corrupt snapshot is
// refused whole with kvstore::error(bad_file), never half-loaded. Where the file lives and how it
// is written is server/checkpoint.hpp's job; what goes into it, server/snapshots.hpp's.
//
// Layout (little-endian, as every control message): magic "KVSNAP01" | u32 version | u64 body
// length | u32 crc32(body) | body, where body is
//   u32 rank | str optimizer name | str optimizer params | u64 slices, then per slice
//   u64 key | u32 dtype | u64 total | u64 lo | u64 hi | u64 row length | u64 round | u64 step |
//   u64 value bytes | u32 slots | value | slots (value bytes each) |
//   u32 n | n x (u32 rank | u64 last push applied) |
//   u32 n | n x (u32 rank | u64 seq | u64 frames applied)     (version 2 and later) |
//   f64 lr_mult | f64 wd_mult (IEEE bits as u64)                (version 3)
#pragma once

#include <kvstore/detail/atomic_file.hpp>
#include <kvstore/error.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>
#include <kvstore/wire/meta.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvstore::wire {

inline constexpr char snapshot_magic[8] = {'K', 'V', 'S', 'N', 'A', 'P', '0', '1'};
// 2 added parts, 3 the key's multipliers; files of versions 1 and 2 still load.
inline constexpr std::uint32_t snapshot_version = 3;

/// What a key slice is (key, element type, its range of the whole value, row length) and its
/// version, `round`: sync rounds completed (dist_sync) or pushes applied (dist_async; counted
/// since issue 13, so older snapshots of async slices hold 0 there). A server's slice and its
/// snapshot share these fields, so a snapshot and a restore each copy them in one assignment.
struct slice_header {
  std::uint64_t key = 0;
  dtype type = dtype::none;
  std::uint64_t total = 0, lo = 0, hi = 0, row_length = 0;
  std::uint64_t round = 0;
};

/// An async push sent in several frames, of which the first `frames` were applied when the
/// snapshot was taken.
struct part_snapshot {
  int rank = 0;
  std::uint64_t seq = 0, frames = 0;
};

/// One key slice as saved.
struct slice_snapshot : slice_header {
  slice_snapshot() { type = dtype::f32; }
  std::string value;               // (hi - lo) elements, raw
  std::uint64_t step = 0;          // optimizer steps applied
  std::vector<std::string> slots;  // optimizer state slots, raw, (hi - lo) elements each
  std::vector<std::pair<int, std::uint64_t>> applied;  // per worker: last push applied
  std::vector<part_snapshot> parts;  // per worker: an async push applied in part (version 2)
  double lr_mult = 1, wd_mult = 1;   // the key's multipliers (set_key_options; version 3)
};

struct shard_snapshot {
  int rank = 0;
  std::string optimizer_name, optimizer_params;
  std::vector<slice_snapshot> slices;
};

/// The snapshot file around `body`: magic | u32 version | u64 body length | u32 crc32(body) | body.
inline std::string wrap_snapshot_body(std::string_view body,
                                      std::uint32_t version = snapshot_version) {
  meta_writer h;
  h.raw(std::string_view(snapshot_magic, sizeof snapshot_magic))
      .u32(version)
      .u64(body.size())
      .u32(kvstore::detail::checksum(body));
  std::string out = h.take();
  out.append(body);
  return out;
}

/// Bytes of a snapshot (the current version).
inline std::string encode_snapshot(const shard_snapshot& s) {
  meta_writer b;
  b.u32(static_cast<std::uint32_t>(s.rank)).str(s.optimizer_name).str(s.optimizer_params);
  b.u64(s.slices.size());
  for (auto& x : s.slices) {
    b.u64(x.key)
        .u32(static_cast<std::uint32_t>(x.type))
        .u64(x.total)
        .u64(x.lo)
        .u64(x.hi)
        .u64(x.row_length)
        .u64(x.round)
        .u64(x.step)
        .u64(x.value.size())
        .u32(static_cast<std::uint32_t>(x.slots.size()));
    b.raw(x.value);
    for (auto& sl : x.slots) b.raw(sl);
    b.u32(static_cast<std::uint32_t>(x.applied.size()));
    for (auto [r, q] : x.applied) b.u32(static_cast<std::uint32_t>(r)).u64(q);
    b.u32(static_cast<std::uint32_t>(x.parts.size()));
    for (auto& p : x.parts) b.u32(static_cast<std::uint32_t>(p.rank)).u64(p.seq).u64(p.frames);
    b.u64(std::bit_cast<std::uint64_t>(x.lr_mult)).u64(std::bit_cast<std::uint64_t>(x.wd_mult));
  }
  return wrap_snapshot_body(b.take());
}

/// Parses and checks a snapshot of version 1, 2 or 3; throws kvstore::error(bad_file) naming
/// `what` (the path) and the problem.
inline shard_snapshot decode_snapshot(std::string_view bytes, const std::string& what) {
  auto bad = [&](const std::string& why) -> error {
    return error(errc::bad_file, "server snapshot '" + what + "': " + why);
  };
  const std::size_t head = sizeof snapshot_magic + 4 + 8 + 4;
  if (bytes.size() < head) throw bad("truncated (" + std::to_string(bytes.size()) + " bytes)");
  if (std::memcmp(bytes.data(), snapshot_magic, sizeof snapshot_magic) != 0)
    throw bad("not a kvstore server snapshot");
  try {
    meta_reader h(bytes.substr(sizeof snapshot_magic, head - sizeof snapshot_magic));
    const auto version = h.u32();
    if (version < 1 || version > snapshot_version)
      throw bad("format version " + std::to_string(version) + ", expected " +
                std::to_string(snapshot_version));
    const auto len = h.u64();
    const auto crc = h.u32();
    if (len != bytes.size() - head)
      throw bad("body of " + std::to_string(bytes.size() - head) + " bytes, header says " +
                std::to_string(len));
    std::string_view body = bytes.substr(head);
    if (kvstore::detail::checksum(body) != crc) throw bad("checksum mismatch (corrupt)");
    meta_reader r(body);
    shard_snapshot s;
    s.rank = static_cast<int>(r.u32());
    s.optimizer_name = r.str();
    s.optimizer_params = r.str();
    const auto n = r.u64();
    if (n > body.size()) throw bad("implausible slice count");
    for (std::uint64_t i = 0; i < n; ++i) {
      slice_snapshot x;
      x.key = r.u64();
      const auto t = r.u32();
      if (t != static_cast<std::uint32_t>(dtype::f32) &&
          t != static_cast<std::uint32_t>(dtype::f64))
        throw bad("unknown element type " + std::to_string(t));
      x.type = static_cast<dtype>(t);
      x.total = r.u64();
      x.lo = r.u64();
      x.hi = r.u64();
      x.row_length = r.u64();
      x.round = r.u64();
      x.step = r.u64();
      const auto vbytes = r.u64();
      const auto nslots = r.u32();
      const std::size_t elem = dtype_size(x.type);
      if (x.lo >= x.hi || x.hi > x.total ||
          (x.row_length && (x.total % x.row_length || x.lo % x.row_length || x.hi % x.row_length)))
        throw bad("slice [" + std::to_string(x.lo) + ", " + std::to_string(x.hi) + ") of " +
                  std::to_string(x.total) + " is not valid");
      if ((x.hi - x.lo) > r.remaining() / elem || vbytes != (x.hi - x.lo) * elem)
        throw bad("value size does not match its slice");
      if (nslots > max_state_slots) throw bad("too many optimizer slots");
      x.value = std::string(r.bytes(vbytes));
      for (std::uint32_t k = 0; k < nslots; ++k) x.slots.emplace_back(r.bytes(vbytes));
      const auto napplied = r.u32();
      if (napplied > r.remaining() / 12) throw bad("implausible worker count");
      for (std::uint32_t k = 0; k < napplied; ++k) {
        const auto rank = r.u32();
        x.applied.emplace_back(static_cast<int>(rank), r.u64());
      }
      if (version >= 2) {
        const auto nparts = r.u32();
        if (nparts > r.remaining() / 20) throw bad("implausible count of pushes in progress");
        for (std::uint32_t k = 0; k < nparts; ++k) {
          part_snapshot p;
          p.rank = static_cast<int>(r.u32());
          p.seq = r.u64();
          p.frames = r.u64();
          x.parts.push_back(p);
        }
      }
      if (version >= 3) {
        x.lr_mult = std::bit_cast<double>(r.u64());
        x.wd_mult = std::bit_cast<double>(r.u64());
        if (!std::isfinite(x.lr_mult) || !std::isfinite(x.wd_mult))
          throw bad("a key's multipliers are not finite");
      }
      s.slices.push_back(std::move(x));
    }
    if (!r.done()) throw bad("trailing bytes");
    return s;
  } catch (const error& e) {
    if (e.code() == make_error_code(errc::bad_file)) throw;
    throw bad(std::string("truncated or malformed: ") + e.what());
  }
}

}  // namespace kvstore::wire
