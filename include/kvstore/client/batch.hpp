// A multi-key call's small keys, batched (issue 12): each server's keys go in frames of at most
// chunk_bytes, their ids, sizes and push numbers in one array in the metadata
// (wire::put_batch_entry) and their values one after the other in the payload; one request per
// frame, answered by one response (init, push) or by data frames whose values are copied to the
// callers' buffers key by key (pull). The API layer (dist.hpp) picks the keys (batches::small,
// plain on the wire) and runs a call's batch as one engine op over all of its keys
// (engine/engine.hpp), so per-key order holds between batched and one-key ops.
#pragma once

#include <kvstore/client/batch_frames.hpp>
#include <kvstore/client/call.hpp>
#include <kvstore/client/client.hpp>
#include <kvstore/client/key_record.hpp>
#include <kvstore/client/partition.hpp>
#include <kvstore/detail/block_pool.hpp>
#include <kvstore/detail/prefetch.hpp>
#include <kvstore/error.hpp>
#include <kvstore/op.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// A value of at most this many bytes is small: it travels in batches, copied into the frame.
/// Bigger ones go in frames of their own, straight from the caller's buffer.
inline constexpr std::size_t batch_value_bytes = std::size_t{16} << 10;

/// The small keys of one multi-key call: distinct keys with their buffers, in first-appearance
/// order (with what the frames need of each record, read while it is at hand), and the buffers
/// of keys the call named again (summed into the first for a push, each filled for a pull).
/// A key named twice is found by its record's mark (key_record::batch_call), which the caller
/// writes under the store's lock for multi-key calls: no lookup, no allocation per key.
template <class Buf>
struct batch {
  struct entry {
    key_record* rec;
    Buf buf;
    std::uint64_t id, total;
    int server;
    std::atomic<std::uint64_t>* pushes;  // rec->pushes: numbered without reading the record
  };
  struct repeat {
    std::uint32_t at;  // the key's index in entries
    Buf buf;
  };

  /// A batch of call `call` (unique in the store, not 0), for about `expected` keys.
  explicit batch(std::uint64_t call, std::size_t expected = 0) : call_(call) {
    entries.reserve(expected);
  }
  /// Adds key m (one slice: m->home) and its buffer; the caller holds the lock over marks.
  void add(key_record* m, std::uint64_t id, Buf b) {
    if (m->batch_call == call_) return repeats.push_back({m->batch_at, b});
    m->batch_call = call_;
    m->batch_at = static_cast<std::uint32_t>(entries.size());
    entries.push_back({m, b, id, m->total, m->home, m->pushes});
  }
  /// Adds key m (of id `id`), known not to be in the batch yet (no mark read or written).
  void add_distinct(key_record* m, std::uint64_t id, Buf b) {
    entries.push_back({m, b, id, m->total, m->home, m->pushes});
  }
  std::size_t size() const noexcept { return entries.size(); }

  std::vector<entry> entries;
  std::vector<repeat> repeats;
  /// The entries' frames, cut before (a planned call's: client/batch_frames.hpp); else cut as
  /// the batch is sent.
  std::shared_ptr<const batch_frames> cut;

 private:
  std::uint64_t call_;
};

template <class T>
class batches {
  static constexpr wire::dtype dtype = wire::dtype_of<T>();

 public:
  using done_fn = op_state::continuation;
  using in_batch = batch<std::span<const T>>;
  using out_batch = batch<std::span<T>>;

  explicit batches(worker_client& c) : client_(c) {}

  /// Whether key m is small: a value of at most batch_value_bytes, whole on one server. (The
  /// caller checks it travels plain: compressed keys go one by one.)
  static bool small(const key_record& m) noexcept {
    return m.home >= 0 && m.total * sizeof(T) <= batch_value_bytes;
  }

  /// The frames of a batch of `entries`, cut as this client sends them (kept by a planned call,
  /// and set as its batches' batch::cut).
  template <class Entry>
  batch_frames cut(std::span<const Entry> entries) const {
    return cut_frames(entries, static_cast<std::size_t>(client_.num_servers()),
                      client_.options().chunk_bytes, sizeof(T));
  }

  /// The keys' inits, rank 0's (`with_data`) carrying the values; done once every server
  /// answered. A key of a refused frame gets failed[j] = 1 (b.size() entries, written before
  /// done runs).
  void init(const in_batch& b, bool with_data, std::vector<char>& failed, done_fn done) {
    const auto plan = frames_of(b);
    auto all = make_pooled<op_state>(plan->frames.size(), std::move(done));
    const auto& o = client_.options();
    for (const frame& fr : plan->frames) {
      transport::out_frame f;
      f.meta = entries<true>(b, *plan, fr, [](const auto& e) { return e.rec->row_length; });
      f.h = wire::batch_header(wire::cmd::batch_init, dtype, fr.keys(), fr.elements, 0, with_data);
      if (with_data) pack(f, b, *plan, fr);
      // This frame's keys are marked failed when it is refused.
      auto part = make_pooled<op_state>(
          1, [all, &failed, plan, lo = fr.lo, hi = fr.hi](std::exception_ptr e) {
            if (e)
              for (std::size_t k = lo; k < hi; ++k) failed[plan->order[k]] = 1;
            all->complete_part(e);
          });
      worker_client::request r = request_of(part, call_kind::init, b, *plan, fr);
      r.timeout = o.connect_timeout + o.request_timeout;
      client_.send(fr.server, std::move(f), std::move(r));
    }
  }

  /// The keys' pushes, each numbered as a one-key push is (key_record::pushes); a key named
  /// again is summed into its first value first. Done once every server answered.
  void push(in_batch& b, int priority, done_fn done) {
    std::vector<std::vector<T>> sums;
    sum_repeats(b, sums);
    const auto plan = frames_of(b);
    auto all = make_pooled<op_state>(plan->frames.size(), std::move(done));
    for (const frame& fr : plan->frames) {
      transport::out_frame f;
      f.meta = entries<false>(b, *plan, fr, [](const auto& e) { return next_push_seq(*e.pushes); });
      f.h = wire::batch_header(wire::cmd::batch_push, dtype, fr.keys(), fr.elements, priority);
      pack(f, b, *plan, fr);
      client_.send(fr.server, std::move(f), request_of(all, call_kind::push, b, *plan, fr));
    }
  }

  /// The keys' values, each server's answer copied into the buffers key by key, and into the
  /// buffers of keys named again once all are in. Done once every answer arrived.
  void pull(std::shared_ptr<out_batch> b, int priority, done_fn done) {
    auto plan = frames_of(*b);
    auto all = make_pooled<op_state>(plan->frames.size(),
                                     [b, done = std::move(done)](std::exception_ptr e) {
                                       if (!e)
                                         for (auto& r : b->repeats) {
                                           const auto& from = b->entries[r.at].buf;
                                           std::copy(from.begin(), from.end(), r.buf.begin());
                                         }
                                       done(e);
                                     });
    for (const frame& fr : plan->frames) {
      transport::out_frame f;
      f.meta = entries<false>(*b, *plan, fr, [](const auto&) { return std::uint64_t{0}; });
      f.h = wire::batch_header(wire::cmd::batch_pull, dtype, fr.keys(), fr.elements, priority);
      worker_client::request r = request_of(all, call_kind::pull, *b, *plan, fr);
      auto to = std::make_shared<scatter>(scatter{b, plan, fr.lo, fr.elements});
      r.on_data = [to](const wire::header& h, std::span<const std::byte> payload) {
        to->take(h, payload);
      };
      client_.send(fr.server, std::move(f), std::move(r));
    }
  }

 private:
  using frame = batch_frames::frame;

  // The batch's frames: its cut if it has one, else cut now.
  template <class Batch>
  std::shared_ptr<const batch_frames> frames_of(const Batch& b) const {
    if (b.cut) return b.cut;
    return std::make_shared<const batch_frames>(
        cut(std::span<const typename Batch::entry>(b.entries)));
  }

  // How many keys ahead a walk over a frame's keys prefetches their records.
  static constexpr std::size_t prefetch_ahead = 8;

  // The frame's entries (wire::put_batch_entry), aux(entry) each. `ReadsRecord`: aux reads the
  // key's record (an init's rows), so the walk loads records a few keys ahead; a push's walk
  // (its counts are the key table's, entry::pushes) and a pull's read no record at all, nor may
  // a planned call's engine op have (engine::renew).
  template <bool ReadsRecord, class Batch, class Aux>
  static std::string entries(const Batch& b, const batch_frames& p, const frame& fr, Aux&& aux) {
    std::string meta(fr.keys() * wire::batch_entry_size, '\0');
    char* at = meta.data();
    for (std::size_t k = fr.lo; k < fr.hi; ++k, at += wire::batch_entry_size) {
      if (ReadsRecord && k + prefetch_ahead < fr.hi)
        prefetch(b.entries[p.order[k + prefetch_ahead]].rec);
      const auto& e = b.entries[p.order[k]];
      const std::uint64_t x = aux(e);
      wire::put_batch_entry(at, wire::batch_entry{e.id, e.total, x});
    }
    return meta;
  }

  // The frame's values, one after the other, copied into a payload buffer the frame keeps.
  static void pack(transport::out_frame& f, const in_batch& b, const batch_frames& p,
                   const frame& fr) {
    std::shared_ptr<std::byte[]> buf(new std::byte[fr.elements * sizeof(T)]);
    T* at = reinterpret_cast<T*>(buf.get());
    for (std::size_t k = fr.lo; k < fr.hi; ++k) {
      const auto& v = b.entries[p.order[k]].buf;
      if (v.size() == 1)
        *at = v[0];  // most small keys are one element: no call to memcpy
      else
        std::memcpy(at, v.data(), v.size() * sizeof(T));
      at += v.size();
    }
    f.payload = buf.get();
    f.payload_len = fr.elements * sizeof(T);
    f.keep = std::move(buf);
  }

  // A push naming a key again sums its values into one buffer first (in `sums`).
  static void sum_repeats(in_batch& b, std::vector<std::vector<T>>& sums) {
    if (b.repeats.empty()) return;
    std::vector<std::uint32_t> sum_of(b.size(), ~std::uint32_t{0});
    for (auto& r : b.repeats) {
      if (sum_of[r.at] == ~std::uint32_t{0}) {
        sum_of[r.at] = static_cast<std::uint32_t>(sums.size());
        const auto& first = b.entries[r.at].buf;
        sums.emplace_back(first.begin(), first.end());
      }
      auto& sum = sums[sum_of[r.at]];
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += r.buf[i];
    }
    for (std::size_t j = 0; j < b.size(); ++j)
      if (sum_of[j] != ~std::uint32_t{0}) b.entries[j].buf = std::span<const T>(sums[sum_of[j]]);
  }

  template <class Batch>
  static worker_client::request request_of(std::shared_ptr<op_state> part, call_kind kind,
                                           const Batch& b, const batch_frames& p, const frame& fr) {
    worker_client::request r;
    r.done = std::move(part);
    r.what = {kind, &b.entries[p.order[fr.lo]].rec->k};
    r.what.keys = fr.keys();
    return r;
  }

  // A batched pull's answer, frame by frame, into the callers' buffers: the values arrive in
  // the request's key order, each data frame's offset counting elements from the first.
  struct scatter {
    std::shared_ptr<out_batch> b;
    std::shared_ptr<const batch_frames> plan;
    std::size_t k;           // the next key (a position in plan->order)
    std::uint64_t elements;  // the answer's, all keys
    std::uint64_t got = 0, in_key = 0;

    void take(const wire::header& h, std::span<const std::byte> payload) {
      if (!(h.flags & wire::flag_batch) || h.offset != got || payload.size() % sizeof(T) ||
          payload.size() / sizeof(T) > elements - got)
        throw error(errc::protocol, "a batched pull's answer does not match the request");
      const T* src = reinterpret_cast<const T*>(payload.data());
      std::uint64_t n = payload.size() / sizeof(T);
      got += n;
      while (n) {
        const auto& out = b->entries[plan->order[k]].buf;
        const std::uint64_t take = std::min<std::uint64_t>(n, out.size() - in_key);
        if (take == 1)
          out[in_key] = *src;
        else
          std::memcpy(out.data() + in_key, src, take * sizeof(T));
        src += take;
        n -= take;
        in_key += take;
        if (in_key == out.size()) {
          ++k;
          in_key = 0;
        }
      }
      if ((h.flags & wire::flag_last) && got != elements)
        throw error(errc::protocol, "a batched pull's answer is short of the request");
    }
  };

  worker_client& client_;
};

}  // namespace kvstore::detail
