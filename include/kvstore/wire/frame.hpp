// The wire format, all of it in this one file (as Beast keeps websocket/detail/frame.hpp).
//
// A frame is a fixed 80-byte little-endian header, then `meta_len` bytes of metadata (row ids,
// names, serialized control messages), then `payload_len` bytes of raw payload (tensor bytes,
// never serialized element by element). Every field is validated before anything is allocated.
#pragma once

#include <kvstore/error.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace kvstore::wire {

inline constexpr std::uint32_t magic = 0x314B564Bu;  // "KVK1" in memory order
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t header_size = 80;
/// Metadata is small (row ids, names, control messages); bigger is refused.
inline constexpr std::uint64_t max_meta_default = std::uint64_t{64} << 20;

enum class cmd : std::uint16_t {
  hello = 1,      ///< first frame on a connection: role, rank, node id (meta: token proof)
  challenge,      ///< acceptor -> client, first frame of every connection: nonce (meta)
  reg,            ///< node -> scheduler: register (meta: host, port)
  address_book,   ///< scheduler -> node: ids, ranks, servers' addresses (meta)
  barrier,        ///< worker -> scheduler; answered with response
  heartbeat,      ///< node -> scheduler
  bye,            ///< worker -> scheduler/servers: leaving cleanly
  shutdown,       ///< scheduler -> nodes: the job is over
  node_dead,      ///< scheduler -> nodes: `key` = the dead node's id
  dead_count,     ///< worker -> scheduler: count dead nodes (key = groups, total = timeout ms)
  init,           ///< worker -> server: a slice of a key's initial value
  push,           ///< worker -> server: a chunk of a key's value or gradient
  pull,           ///< worker -> server: ask for a key's slice
  push_rows,      ///< worker -> server: rows (meta: int64 row ids) and their values
  pull_rows,      ///< worker -> server: ask for rows (meta: int64 row ids)
  set_optimizer,  ///< worker -> server (meta: name '\0' params)
  command,        ///< worker -> server: user command (key = head, meta = body)
  save_states,    ///< worker -> server: answer with the shard's optimizer states
  load_states,    ///< worker -> server: replace the shard's optimizer states
  response,       ///< answer to a request: same req_id; status = errc; meta = message on error
  data,           ///< server -> worker: a chunk of a pull's answer (offset in `offset`)
  leave,          ///< worker -> servers/scheduler: no more rounds from this worker
  auth,           ///< client -> acceptor: HMAC proof for the challenge's nonce (meta)
  checkpoint,     ///< worker -> server: write the shard's snapshot now
  version,        ///< worker -> server: answer with the key slice's version (issue 13)
  key_options,    ///< worker -> server: a key's lr_mult / wd_mult (issue 13)
  batch_init,     ///< worker -> server: many small keys' inits (meta: batch entries; issue 12)
  batch_push,     ///< worker -> server: many small keys' pushes, values one after the other
  batch_pull,     ///< worker -> server: many small keys' values (answered by data frames)
  last_ = batch_pull,
};

/// Element types on the wire.
enum class dtype : std::uint32_t { none = 0, f32 = 1, f64 = 2 };

inline std::size_t dtype_size(dtype t) noexcept {
  return t == dtype::f32 ? 4 : t == dtype::f64 ? 8 : 0;
}
template <class T>
constexpr dtype dtype_of() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return dtype::f32;
  else if constexpr (std::is_same_v<T, double>)
    return dtype::f64;
  else
    return dtype::none;
}

/// Frame flags.
enum flag : std::uint32_t {
  flag_last = 1u << 0,      ///< last chunk of this request from this sender
  flag_has_data = 1u << 1,  ///< init: this chunk carries the value (rank 0)
  flag_rows = 1u << 2,      ///< data: the answer of a pull_rows
  /// push/pull: an element range of the key (meta: range_meta, its offset and length on this
  /// server); data: the answer of a range pull (offset counted from the range's first element)
  flag_range = 1u << 3,
  /// data: the answer of a batch_pull (its keys' values one after the other; offset counted
  /// in elements from the first)
  flag_batch = 1u << 4,
  /// batch_push: each key answered on its own, key i (in the entries' order) by a response to
  /// req_id + i, as its push would be (a worker's fused one-key pushes, client/fusion.hpp).
  /// response: an ok answer to aux requests, ids req_id .. req_id + aux - 1, each of which needs
  /// nothing but "done" (pushes; wire::acks_header)
  flag_each = 1u << 5,
};

/// Bits 24-27 of a push's, pull's or data frame's flags: the payload's encoding
/// (a compression::kind; 0 = plain T).
inline constexpr unsigned encoding_shift = 24;
inline constexpr std::uint32_t encoding_mask = 0xFu << encoding_shift;

/// A payload's encoding, numbered as compression::kind. wire/encoding.hpp has the element
/// conversions and the payload layouts; a pull asks for its answer's encoding this way too.
enum class encoding : std::uint8_t { plain = 0, fp16 = 1, bf16 = 2, bf16_trunc = 3, two_bit = 4 };
inline constexpr unsigned encoding_count = 5;

/// Whether command `c` carries an encoding in its flags (push, pull, data); others ignore them.
inline bool carries_encoding(cmd c) noexcept {
  return c == cmd::push || c == cmd::pull || c == cmd::data;
}
/// The encoding bits of `flags`, as sent: a value of encoding_count or more is one this
/// program does not know.
inline unsigned encoding_bits(std::uint32_t flags) noexcept {
  return (flags & encoding_mask) >> encoding_shift;
}
inline std::uint32_t encoding_flags(encoding e) noexcept {
  return static_cast<std::uint32_t>(e) << encoding_shift;
}

struct header {
  cmd command = cmd::response;
  std::uint32_t flags = 0;
  std::uint32_t meta_len = 0;
  std::uint64_t payload_len = 0;
  std::uint64_t key = 0;
  std::uint64_t req_id = 0;
  std::uint64_t offset = 0;  ///< element offset within the key (data frames)
  std::uint64_t total = 0;   ///< the key's element count, or a command's argument
  std::int32_t priority = 0;
  std::int32_t sender = 0;  ///< node id of the sender
  dtype type = dtype::none;
  std::uint32_t status = 0;  ///< errc of a response
  std::uint64_t aux = 0;     ///< row length (init), round, or a command's second argument
};

/// An ok answer to the n requests with ids first .. first + n - 1, pushes all (a push needs
/// nothing of its answer but that it is done): one response flagged flag_each, aux = n. Servers
/// answer pushes so, and a connection merges adjacent ones into one frame
/// (transport/send_queue.hpp): a worker with many pushes in flight takes one answer for many.
inline header acks_header(std::uint64_t first, std::uint64_t n) noexcept {
  header h;
  h.command = cmd::response;
  h.req_id = first;
  h.aux = n;
  h.flags = flag_each;
  return h;
}
/// Whether `h` is such an answer (and nothing else: no status, text or payload).
inline bool is_acks(const header& h) noexcept {
  return h.command == cmd::response && h.flags == flag_each && h.status == 0 && h.meta_len == 0 &&
         h.payload_len == 0 && h.aux != 0;
}

namespace detail {
// Little-endian fields: a plain load or store where the machine is little-endian (byte loops are
// not always seen as one by the compiler, and a batched frame reads three per key).
template <class U>
inline void put_le(std::byte* p, U v) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (std::size_t i = 0; i < sizeof v; ++i) p[i] = std::byte(v >> (8 * i));
  }
}
template <class U>
inline U get_le(const std::byte* p) {
  U v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, sizeof v);
  } else {
    for (std::size_t i = sizeof v; i-- > 0;)
      v = static_cast<U>((v << 8) | std::to_integer<U>(p[i]));
  }
  return v;
}
inline void put16(std::byte* p, std::uint16_t v) { put_le(p, v); }
inline void put32(std::byte* p, std::uint32_t v) { put_le(p, v); }
inline void put64(std::byte* p, std::uint64_t v) { put_le(p, v); }
inline std::uint16_t get16(const std::byte* p) { return get_le<std::uint16_t>(p); }
inline std::uint32_t get32(const std::byte* p) { return get_le<std::uint32_t>(p); }
inline std::uint64_t get64(const std::byte* p) { return get_le<std::uint64_t>(p); }
}  // namespace detail

using header_bytes = std::array<std::byte, header_size>;

/// Layout: magic u32 | version u16 | cmd u16 | flags u32 | meta_len u32 | payload_len u64 |
/// key u64 | req_id u64 | offset u64 | total u64 | priority i32 | sender i32 | dtype u32 |
/// status u32 | aux u64  = 80 bytes.
inline header_bytes encode(const header& h) {
  header_bytes b{};
  std::byte* p = b.data();
  detail::put32(p + 0, magic);
  detail::put16(p + 4, version);
  detail::put16(p + 6, static_cast<std::uint16_t>(h.command));
  detail::put32(p + 8, h.flags);
  detail::put32(p + 12, h.meta_len);
  detail::put64(p + 16, h.payload_len);
  detail::put64(p + 24, h.key);
  detail::put64(p + 32, h.req_id);
  detail::put64(p + 40, h.offset);
  detail::put64(p + 48, h.total);
  detail::put32(p + 56, static_cast<std::uint32_t>(h.priority));
  detail::put32(p + 60, static_cast<std::uint32_t>(h.sender));
  detail::put32(p + 64, static_cast<std::uint32_t>(h.type));
  detail::put32(p + 68, h.status);
  detail::put64(p + 72, h.aux);
  return b;
}

/// Limits a decoder enforces before anything is allocated.
struct limits {
  std::uint64_t max_payload = std::uint64_t{1} << 30;
  std::uint64_t max_meta = max_meta_default;
};

/// The bytes a payload's size must be a multiple of: an element of its type, or of its
/// encoding (2 for the 16-bit ones). 2-bit payloads and unknown encodings are sized by the
/// receiver, which knows the key (server/shard.hpp).
inline std::size_t payload_unit(const header& h) noexcept {
  if (!carries_encoding(h.command)) return dtype_size(h.type);
  switch (encoding_bits(h.flags)) {
    case 0:
      return dtype_size(h.type);
    case static_cast<unsigned>(encoding::fp16):
    case static_cast<unsigned>(encoding::bf16):
    case static_cast<unsigned>(encoding::bf16_trunc):
      return 2;
    default:
      return 1;
  }
}

/// Decodes and validates a header. On failure returns false and says why in `why`; the caller
/// closes that connection (and only that one) with the reason logged.
inline bool decode(const std::byte* p, header& h, const limits& lim, std::string& why) {
  if (detail::get32(p) != magic) {
    why = "bad magic";
    return false;
  }
  if (auto v = detail::get16(p + 4); v != version) {
    why = "protocol version " + std::to_string(v) + " (expected " + std::to_string(version) + ")";
    return false;
  }
  auto c = detail::get16(p + 6);
  if (c < static_cast<std::uint16_t>(cmd::hello) || c > static_cast<std::uint16_t>(cmd::last_)) {
    why = "unknown command " + std::to_string(c);
    return false;
  }
  h.command = static_cast<cmd>(c);
  h.flags = detail::get32(p + 8);
  h.meta_len = detail::get32(p + 12);
  h.payload_len = detail::get64(p + 16);
  h.key = detail::get64(p + 24);
  h.req_id = detail::get64(p + 32);
  h.offset = detail::get64(p + 40);
  h.total = detail::get64(p + 48);
  h.priority = static_cast<std::int32_t>(detail::get32(p + 56));
  h.sender = static_cast<std::int32_t>(detail::get32(p + 60));
  auto t = detail::get32(p + 64);
  if (t > static_cast<std::uint32_t>(dtype::f64)) {
    why = "unknown element type " + std::to_string(t);
    return false;
  }
  h.type = static_cast<dtype>(t);
  h.status = detail::get32(p + 68);
  h.aux = detail::get64(p + 72);
  if (h.meta_len > lim.max_meta) {
    why = "metadata of " + std::to_string(h.meta_len) + " bytes exceeds the limit of " +
          std::to_string(lim.max_meta);
    return false;
  }
  if (h.payload_len > lim.max_payload) {
    why = "payload of " + std::to_string(h.payload_len) + " bytes exceeds the limit of " +
          std::to_string(lim.max_payload);
    return false;
  }
  if (h.payload_len != 0 && h.type != dtype::none && h.payload_len % payload_unit(h) != 0) {
    why =
        "payload of " + std::to_string(h.payload_len) + " bytes is not a whole number of elements";
    return false;
  }
  return true;
}

}  // namespace kvstore::wire
