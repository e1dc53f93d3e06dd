// A batched init (issue 12): the named keys' slices made, those that are new counted against the
// server's bounds first, and each key's value stored from the payload; the frame is refused whole,
// nothing made, when any key cannot be inited. Apart from the batched push and pull
// (server/batch.hpp), which serve keys that exist.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/server/batch_lookup.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace kvstore::detail {

template <class Port>
class shard;

/// The shard's batched inits (a friend of it): batch_ops derives from it.
template <class Port>
struct batch_init_ops : batch_lookup<Port> {
  using shard_t = shard<Port>;
  using slice = key_slice<Port>;
  using planned = planned_slice<slice>;

  /// batch_init: the named keys' slices (whole keys, on this server), created if new, their
  /// value stored from the payload (rank 0: flag_has_data). Answered once every key has a value.
  static void init(shard_t& sh, int rank, const Port& from, const wire::header& h,
                   std::string_view meta, std::span<const std::byte> payload) {
    const auto entries = wire::decode_batch(meta, h.key, h.total);
    if (h.type != wire::dtype::f32 && h.type != wire::dtype::f64)
      throw error(errc::invalid_argument, "a batched init of " + std::to_string(entries.size()) +
                                              " keys without an element type");
    const std::size_t elem = wire::dtype_size(h.type);
    const bool with_data = (h.flags & wire::flag_has_data) != 0;
    check_payload(h, entries.size(), with_data ? h.total * elem : 0, payload.size());
    // Every key checked, and the new ones counted, before anything changes.
    auto& found = sh.batch_slices_;
    found.assign(entries.size(), nullptr);
    const std::uint64_t stamp = ++sh.batch_stamp_;
    std::uint64_t new_keys = 0, new_bytes = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      prefetch_lookup(sh, entries, i);
      const wire::batch_entry e = entries[i];
      const std::uint64_t n = e.elements, rl = e.aux;
      if ((rl && n % rl) || n > sh.cfg_.max_key_bytes / elem)
        throw error(errc::invalid_argument, "key " + shard_t::key_str(e.key) +
                                                ": a batched init of " + std::to_string(n) +
                                                " elements (row length " + std::to_string(rl) +
                                                ") that cannot be a slice here (max_key_bytes " +
                                                std::to_string(sh.cfg_.max_key_bytes) + ")");
      slice* existing = sh.slices_.find_value(e.key);
      if (!existing) {
        ++new_keys;
        new_bytes += n * elem + shard_t::key_overhead_bytes;
        continue;
      }
      slice& s = *existing;
      named_once(s, stamp);
      if (s.type != h.type || s.total != n || s.lo != 0 || s.hi != n || s.row_length != rl)
        throw error(errc::size_mismatch, "key " + shard_t::key_str(e.key) + ": init with " +
                                             std::to_string(n) + " elements (row length " +
                                             std::to_string(rl) + ") but it was inited with " +
                                             std::to_string(s.total) + " (row length " +
                                             std::to_string(s.row_length) + ")");
      if (!(s.restored && s.inited) && (s.init_done.count(rank) || (with_data && s.inited)))
        throw error(errc::already_inited, "key " + shard_t::key_str(e.key) + " is already inited");
      found[i] = &s;
    }
    admit(sh, entries, new_keys, new_bytes);
    create_new(sh, h, entries, stamp, new_bytes);

    guard g(sh);
    const std::uint32_t id = sh.waits_.open(from, h.req_id);
    const std::byte* src = payload.data();
    bool stored = false;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      slice& s = *found[i];
      const std::size_t bytes = entries[i].elements * elem;
      if (s.restored && s.inited) {  // re-sent after a restart: answered, not refused
        src += with_data ? bytes : 0;
        continue;
      }
      s.init_done.insert(rank);
      if (with_data) {
        std::memcpy(s.value.data(), src, bytes);
        src += bytes;
        s.inited = true;
        stored = true;
        sh.release_all(s.init_waiters, errc::ok, {});
      } else if (!s.inited) {
        s.init_waiters.push_back({Port{}, 0, id});
        sh.waits_.add(id);
      }
    }
    if (stored) sh.changed(true);
    sh.waits_.done(id, errc::ok, {}, sh);
  }

 private:
  using batch_lookup<Port>::check_payload;
  using batch_lookup<Port>::named_once;
  using batch_lookup<Port>::prefetch_lookup;
  using typename batch_lookup<Port>::guard;

  // The new keys of a batched init fit max_keys and max_total_bytes (shard::admit_new_slice).
  static void admit(shard_t& sh, const wire::batch_entries& entries, std::uint64_t keys,
                    std::uint64_t bytes) {
    if (!keys) return;
    const auto& c = sh.cfg_;
    auto first_new = [&] {
      for (std::size_t i = 0; i < entries.size(); ++i)
        if (!sh.slices_.count(entries[i].key)) return shard_t::key_str(entries[i].key);
      return std::string("?");
    };
    if (keys > c.max_keys || sh.slices_.size() > c.max_keys - keys)
      throw error(errc::invalid_argument,
                  "key " + first_new() + ": " + std::to_string(keys) + " new keys would take " +
                      sh.who_ + " past its max_keys (" + std::to_string(c.max_keys) +
                      ", KVSTORE_MAX_KEYS; " + std::to_string(sh.slices_.size()) + " held)");
    if (c.max_total_bytes &&
        (bytes > c.max_total_bytes || sh.held_bytes_ > c.max_total_bytes - bytes))
      throw error(errc::invalid_argument,
                  "key " + first_new() + ": " + std::to_string(bytes) + " more bytes would take " +
                      sh.who_ + " past its max_total_bytes (" + std::to_string(c.max_total_bytes) +
                      ", KVSTORE_MAX_TOTAL_BYTES; " + std::to_string(sh.held_bytes_) + " held)");
  }

  // Makes the slices of the keys not found (found[i] == nullptr). A new key named twice is
  // found made already by this frame: the slices made are removed again and the frame refused.
  static void create_new(shard_t& sh, const wire::header& h, const wire::batch_entries& entries,
                         std::uint64_t stamp, std::uint64_t added) {
    auto& found = sh.batch_slices_;
    const std::uint64_t made_here = stamp + 1;  // marks the slices made here, until the end
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (found[i]) continue;
      const wire::batch_entry e = entries[i];
      auto [it, fresh] = sh.slices_.try_emplace(e.key);
      if (!fresh) {
        for (std::size_t j = 0; j < i; ++j)
          if (found[j] && found[j]->batch_stamp == made_here) sh.slices_.erase(found[j]->key);
        throw error(errc::protocol,
                    "key " + shard_t::key_str(e.key) + " named twice in one batched request");
      }
      slice& s = it->second;
      s.key = e.key;
      s.type = h.type;
      s.total = e.elements;
      s.lo = 0;
      s.hi = e.elements;
      s.row_length = e.aux;
      s.value = slice_value(e.elements * wire::dtype_size(h.type));
      s.batch_stamp = made_here;
      found[i] = &s;
    }
    for (auto* s : found) s->batch_stamp = stamp;
    sh.held_bytes_ += added;
  }
};

}  // namespace kvstore::detail
