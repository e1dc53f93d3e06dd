// Control messages as pure encode/decode pairs, so every byte a peer can send is parsed in one
// place that a fuzzer reaches without sockets (fuzz/fuzz_messages.cpp). Each decoder checks the
// whole message before returning: counts are bounded by the bytes actually present before
// anything is allocated, enums are in range, ranges are ordered, sizes cannot overflow, and no
// byte is left over. Any violation throws kvstore::error(errc::protocol, "<message>: <problem>").
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/optim/slots.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/meta.hpp>

#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::wire {

/// Host names are at most 253 bytes (DNS); a longer one is garbage, not an address.
inline constexpr std::size_t max_host_len = 255;
/// Registered optimizer names are short; parameters are a short "k=v,..." text.
inline constexpr std::size_t max_optimizer_name_len = 4096;
/// At most this many optimizer slots per key: the optimizers' own bound.
inline constexpr std::uint32_t max_state_slots = optim::max_slots;

namespace detail {
[[noreturn]] inline void bad(const char* what, const std::string& problem) {
  throw error(errc::protocol, std::string(what) + ": " + problem);
}
inline void expect_done(const meta_reader& r, const char* what) {
  if (!r.done()) bad(what, std::to_string(r.remaining()) + " unexpected trailing bytes");
}
inline std::uint16_t port_of(std::uint32_t p, const char* what) {
  if (p > 65535) bad(what, "port " + std::to_string(p) + " out of range");
  return static_cast<std::uint16_t>(p);
}
inline std::string host_of(meta_reader& r, const char* what) {
  auto h = r.str();
  if (h.size() > max_host_len) bad(what, "host name of " + std::to_string(h.size()) + " bytes");
  if (h.find('\0') != std::string::npos) bad(what, "host name with a NUL byte");
  return h;
}
/// Wraps meta_reader's "truncated control message" with the message's name.
template <class F>
auto parse(const char* what, F&& f) {
  try {
    return f();
  } catch (const error& e) {
    if (std::string_view(e.what()) == "truncated control message") bad(what, "truncated");
    throw;
  }
}
}  // namespace detail

// ---- registration: node -> scheduler --------------------------------------------------------
// u32 role | i64 rank hint | str host (empty: the scheduler uses the peer's address) | u32 port
// | u32 num_workers | u32 num_servers (the node's own job size: the scheduler checks it)

struct registration {
  kvstore::role r = kvstore::role::worker;
  int rank_hint = -1;  ///< negative: none
  std::string host;
  std::uint16_t port = 0;
  int num_workers = 0;
  int num_servers = 0;
};

inline std::string encode_registration(const registration& m) {
  meta_writer w;
  w.u32(static_cast<std::uint32_t>(m.r)).i64(m.rank_hint).str(m.host).u32(m.port);
  w.u32(static_cast<std::uint32_t>(m.num_workers)).u32(static_cast<std::uint32_t>(m.num_servers));
  return w.take();
}

inline registration decode_registration(std::string_view s) {
  static constexpr const char* what = "registration";
  return detail::parse(what, [&] {
    meta_reader r(s);
    registration m;
    const auto role = r.u32();
    if (role != static_cast<std::uint32_t>(kvstore::role::server) &&
        role != static_cast<std::uint32_t>(kvstore::role::worker))
      detail::bad(what, "unknown role " + std::to_string(role));
    m.r = static_cast<kvstore::role>(role);
    const auto hint = r.i64();
    m.rank_hint = hint < 0 ? -1 : hint > INT_MAX ? -2 : static_cast<int>(hint);
    if (m.rank_hint == -2) detail::bad(what, "rank hint " + std::to_string(hint) + " out of range");
    m.host = detail::host_of(r, what);
    m.port = detail::port_of(r.u32(), what);
    const auto nw = r.u32(), ns = r.u32();
    if (nw > INT_MAX) detail::bad(what, std::to_string(nw) + " workers");
    if (ns > INT_MAX) detail::bad(what, std::to_string(ns) + " servers");
    m.num_workers = static_cast<int>(nw);
    m.num_servers = static_cast<int>(ns);
    detail::expect_done(r, what);
    return m;
  });
}

// ---- address book: scheduler -> node --------------------------------------------------------
// u32 num_workers | u32 num_servers | per server, by rank: u32 rank | u32 id | str host | u32 port
// | str job secret | str credential: a server's book carries the job's secret, a worker's book only
// that worker's credential (transport/identity.hpp); each is empty or identity_size bytes, and at
// most one is set.

/// Bytes of a job secret or a credential (transport::identity_size).
inline constexpr std::size_t identity_bytes = 32;

struct server_address {
  int rank = 0;
  int id = 0;
  std::string host;
  std::uint16_t port = 0;
};

struct address_book {
  int num_workers = 0;
  std::vector<server_address> servers;  ///< servers[i].rank == i
  std::string job_secret;               ///< to servers: checks every worker's hello
  std::string credential;               ///< to a worker: proves its rank in its hellos
};

inline std::string encode_address_book(const address_book& b) {
  meta_writer w;
  w.u32(static_cast<std::uint32_t>(b.num_workers))
      .u32(static_cast<std::uint32_t>(b.servers.size()));
  for (auto& s : b.servers)
    w.u32(static_cast<std::uint32_t>(s.rank))
        .u32(static_cast<std::uint32_t>(s.id))
        .str(s.host)
        .u32(s.port);
  w.str(b.job_secret).str(b.credential);
  return w.take();
}

inline address_book decode_address_book(std::string_view s) {
  static constexpr const char* what = "address book";
  return detail::parse(what, [&] {
    meta_reader r(s);
    address_book b;
    const auto nw = r.u32(), ns = r.u32();
    if (nw > INT_MAX) detail::bad(what, std::to_string(nw) + " workers");
    // Each server takes at least 16 bytes: never allocate for more than are present.
    if (ns > r.remaining() / 16)
      detail::bad(what,
                  std::to_string(ns) + " servers in " + std::to_string(r.remaining()) + " bytes");
    b.num_workers = static_cast<int>(nw);
    b.servers.resize(ns);
    for (std::uint32_t i = 0; i < ns; ++i) {
      auto& a = b.servers[i];
      const auto rank = r.u32(), id = r.u32();
      if (rank != i)
        detail::bad(what, "entry " + std::to_string(i) + " has rank " + std::to_string(rank));
      if (id > INT_MAX) detail::bad(what, "server id " + std::to_string(id) + " out of range");
      a.rank = static_cast<int>(rank);
      a.id = static_cast<int>(id);
      a.host = detail::host_of(r, what);
      a.port = detail::port_of(r.u32(), what);
    }
    b.job_secret = r.str();
    b.credential = r.str();
    for (const std::string* k : {&b.job_secret, &b.credential})
      if (!k->empty() && k->size() != identity_bytes)
        detail::bad(what, (k == &b.job_secret ? "job secret of " : "credential of ") +
                              std::to_string(k->size()) + " bytes");
    if (!b.job_secret.empty() && !b.credential.empty())
      detail::bad(what, "both a job secret and a credential");
    detail::expect_done(r, what);
    return b;
  });
}

// ---- optimizer states of a shard: server <-> worker (save_states / load_states payloads) ------
// per entry: u64 key | u32 dtype | u64 lo | u64 hi | u64 total | u64 step | u32 nslots, then
// nslots slots of (hi - lo) raw elements each (native byte order, like every tensor payload).

struct state_entry {
  std::uint64_t key = 0;
  dtype type = dtype::none;
  std::uint64_t lo = 0, hi = 0, total = 0, step = 0;
  std::uint32_t nslots = 0;
  /// nslots * (hi - lo) * dtype_size(type) bytes: slot i is raw.substr(i * slot_bytes(), ...).
  std::string_view raw;

  std::size_t slot_bytes() const noexcept {
    return static_cast<std::size_t>(hi - lo) * dtype_size(type);
  }
  std::string_view slot(std::uint32_t i) const {
    return raw.substr(i * slot_bytes(), slot_bytes());
  }
};

/// The fixed part of an entry; append the slots' raw bytes after it.
inline std::string encode_state_head(std::uint64_t key, dtype t, std::uint64_t lo, std::uint64_t hi,
                                     std::uint64_t total, std::uint64_t step,
                                     std::uint32_t nslots) {
  meta_writer w;
  w.u64(key).u32(static_cast<std::uint32_t>(t)).u64(lo).u64(hi).u64(total).u64(step).u32(nslots);
  return w.take();
}

inline constexpr std::size_t state_head_size = 8 + 4 + 8 * 4 + 4;

/// Entries in order; their raw bytes point into `s`, which must outlive them.
inline std::vector<state_entry> decode_states(std::string_view s) {
  static constexpr const char* what = "optimizer states";
  return detail::parse(what, [&] {
    meta_reader r(s);
    std::vector<state_entry> out;
    while (!r.done()) {
      state_entry e;
      e.key = r.u64();
      const auto t = r.u32();
      if (t != static_cast<std::uint32_t>(dtype::f32) &&
          t != static_cast<std::uint32_t>(dtype::f64))
        detail::bad(what, "unknown element type " + std::to_string(t));
      e.type = static_cast<dtype>(t);
      e.lo = r.u64();
      e.hi = r.u64();
      e.total = r.u64();
      e.step = r.u64();
      e.nslots = r.u32();
      if (!(e.lo <= e.hi && e.hi <= e.total))
        detail::bad(what, "key " + std::to_string(e.key) + ": range [" + std::to_string(e.lo) +
                              ", " + std::to_string(e.hi) + ") of " + std::to_string(e.total));
      if (e.nslots > max_state_slots)
        detail::bad(what,
                    "key " + std::to_string(e.key) + ": " + std::to_string(e.nslots) + " slots");
      // nslots * (hi - lo) * elem without overflow: compare against the bytes present.
      const std::uint64_t elem = dtype_size(e.type), n = e.hi - e.lo, avail = r.remaining();
      if (e.nslots && (n > avail / elem / e.nslots))
        detail::bad(what, "key " + std::to_string(e.key) + ": " + std::to_string(e.nslots) +
                              " slots of " + std::to_string(n) + " elements in " +
                              std::to_string(avail) + " bytes");
      e.raw = r.bytes(static_cast<std::size_t>(e.nslots * n * elem));
      out.push_back(e);
    }
    return out;
  });
}

// ---- init metadata: worker -> server ---------------------------------------------------------
// u64 lo | u64 hi: the server's slice of the key (checked against the header's total by the server)

struct init_meta {
  std::uint64_t lo = 0, hi = 0;
};

inline std::string encode_init_meta(const init_meta& m) {
  meta_writer w;
  w.u64(m.lo).u64(m.hi);
  return w.take();
}

inline init_meta decode_init_meta(std::string_view s) {
  static constexpr const char* what = "init metadata";
  return detail::parse(what, [&] {
    meta_reader r(s);
    init_meta m;
    m.lo = r.u64();
    m.hi = r.u64();
    detail::expect_done(r, what);
    return m;
  });
}

// ---- range metadata: worker -> server (push and pull flagged flag_range) --------------------
// u64 offset | u64 length: the elements [offset, offset + length) of the key a range push or pull
// covers on the server it goes to. A range is never empty and never wraps; the server checks it
// against its slice.

struct range_meta {
  std::uint64_t offset = 0, length = 0;
};

inline std::string encode_range(const range_meta& m) {
  meta_writer w;
  w.u64(m.offset).u64(m.length);
  return w.take();
}

inline range_meta decode_range(std::string_view s) {
  static constexpr const char* what = "range metadata";
  return detail::parse(what, [&] {
    meta_reader r(s);
    range_meta m;
    m.offset = r.u64();
    m.length = r.u64();
    detail::expect_done(r, what);
    if (m.length == 0) detail::bad(what, "an empty range at " + std::to_string(m.offset));
    if (m.length > ~std::uint64_t{0} - m.offset)
      detail::bad(what, "a range of " + std::to_string(m.length) + " elements at " +
                            std::to_string(m.offset) + " wraps");
    return m;
  });
}

// ---- batched requests: worker -> server (batch_init, batch_push, batch_pull) ------------------
// n entries of 24 bytes: u64 key | u64 elements | u64 aux. Each names a whole key slice (the
// key's elements, all on this server) and aux is the row length (batch_init, 0 for a vector),
// the push number (batch_push, as a push's aux) or 0 (batch_pull). The payload (batch_init with
// data, batch_push), or a batch_pull's answer, holds the entries' values one after the other.

struct batch_entry {
  std::uint64_t key = 0, elements = 0, aux = 0;
};
inline constexpr std::size_t batch_entry_size = 24;

/// Writes entry `e` at `at` (batch_entry_size bytes).
inline void put_batch_entry(char* at, const batch_entry& e) {
  auto* p = reinterpret_cast<std::byte*>(at);
  wire::detail::put64(p, e.key);
  wire::detail::put64(p + 8, e.elements);
  wire::detail::put64(p + 16, e.aux);
}

/// A batched request's entries, read in place from its metadata (which must outlive it).
class batch_entries {
 public:
  batch_entries() = default;
  explicit batch_entries(std::string_view meta) : s_(meta) {}
  std::size_t size() const noexcept { return s_.size() / batch_entry_size; }
  batch_entry operator[](std::size_t i) const noexcept {
    const auto* p = reinterpret_cast<const std::byte*>(s_.data() + i * batch_entry_size);
    return {wire::detail::get64(p), wire::detail::get64(p + 8), wire::detail::get64(p + 16)};
  }

 private:
  std::string_view s_;
};

/// The entries of a batched request whose header says `keys` entries of `elements` elements
/// together: the metadata is exactly that many entries, none empty, their elements (no
/// overflow) add up to `elements`. Nothing is allocated.
inline batch_entries decode_batch(std::string_view meta, std::uint64_t keys,
                                  std::uint64_t elements) {
  static constexpr const char* what = "batched request";
  if (meta.size() % batch_entry_size != 0)
    detail::bad(what, std::to_string(meta.size()) + " bytes of entries is not a whole number");
  const batch_entries e(meta);
  if (e.size() != keys || keys == 0)
    detail::bad(what,
                std::to_string(e.size()) + " entries, the header says " + std::to_string(keys));
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < e.size(); ++i) {
    const std::uint64_t n = e[i].elements;
    if (n == 0 || n > elements - sum)
      detail::bad(what, "key " + std::to_string(e[i].key) + ": " + std::to_string(n) +
                            " elements, past the " + std::to_string(elements) + " the header says");
    sum += n;
  }
  if (sum != elements)
    detail::bad(what, std::to_string(sum) + " elements in the entries, the header says " +
                          std::to_string(elements));
  return e;
}

// ---- set_optimizer metadata: worker -> server ------------------------------------------------
// str name | str params: a registered optimizer's name and parameters, never code

struct optimizer_spec {
  std::string name, params;
};

inline std::string encode_optimizer(const optimizer_spec& m) {
  meta_writer w;
  w.str(m.name).str(m.params);
  return w.take();
}

inline optimizer_spec decode_optimizer(std::string_view s) {
  static constexpr const char* what = "set_optimizer";
  return detail::parse(what, [&] {
    meta_reader r(s);
    optimizer_spec m;
    m.name = r.str();
    if (m.name.size() > max_optimizer_name_len)
      detail::bad(what, "optimizer name of " + std::to_string(m.name.size()) + " bytes");
    m.params = r.str();
    detail::expect_done(r, what);
    return m;
  });
}

// ---- key_options metadata: worker -> server -------------------------------------------------
// f64 lr_mult | f64 wd_mult (IEEE bits as u64): a key's multipliers of the learning rate and
// weight decay (set_key_options), finite

struct key_multipliers {
  double lr_mult = 1, wd_mult = 1;
};

inline std::string encode_key_multipliers(const key_multipliers& m) {
  meta_writer w;
  w.u64(std::bit_cast<std::uint64_t>(m.lr_mult)).u64(std::bit_cast<std::uint64_t>(m.wd_mult));
  return w.take();
}

inline key_multipliers decode_key_multipliers(std::string_view s) {
  static constexpr const char* what = "key_options";
  return detail::parse(what, [&] {
    meta_reader r(s);
    key_multipliers m;
    m.lr_mult = std::bit_cast<double>(r.u64());
    m.wd_mult = std::bit_cast<double>(r.u64());
    if (!std::isfinite(m.lr_mult) || !std::isfinite(m.wd_mult))
      detail::bad(what, "a multiplier that is not finite");
    detail::expect_done(r, what);
    return m;
  });
}

}  // namespace kvstore::wire
