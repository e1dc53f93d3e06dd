// A multi-key call's small keys, batched (issue 12): each server's keys go in frames of at most
// chunk_bytes, their ids, sizes and push numbers in one array in the metadata
// (wire::put_batch_entry) and their values one after the other in the payload; one request per
// frame, answered by one response (init, push) or by data frames whose values are copied to the
// callers' buffers key by key (pull). The API layer (dist.hpp) picks the keys (batches::small,
// plain on the wire) and runs a call's batch as one engine op over all of its keys
// (engine/engine.hpp), so per-key order holds between batched and one-key ops.
#pragma once

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

/// A batched frame names at most this many keys (and holds at most chunk_bytes). A server
/// passes over a frame's slices twice (checks every key, then applies or copies), each key a few
/// cache lines of slice and value: over 4,096 keys (about 1.3 MB) the second pass still finds
/// them in its core's cache, where over the ~37,000 single-float keys of a 1 MiB frame it read
/// them all from memory again.
inline constexpr std::size_t batch_frame_keys = 4096;

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

  /// The keys' inits, rank 0's (`with_data`) carrying the values; done once every server
  /// answered. A key of a refused frame gets failed[j] = 1 (b.size() entries, written before
  /// done runs).
  void init(const in_batch& b, bool with_data, std::vector<char>& failed, done_fn done) {
    const auto plan = std::make_shared<const frame_plan>(frames_of(b));
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
    auto all = make_pooled<op_state>(plan.frames.size(), std::move(done));
    for (const frame& fr : plan.frames) {
      transport::out_frame f;
      f.meta = entries<false>(b, plan, fr, [](const auto& e) { return next_push_seq(*e.pushes); });
      f.h = wire::batch_header(wire::cmd::batch_push, dtype, fr.keys(), fr.elements, priority);
      pack(f, b, plan, fr);
      client_.send(fr.server, std::move(f), request_of(all, call_kind::push, b, plan, fr));
    }
  }

  /// The keys' values, each server's answer copied into the buffers key by key, and into the
  /// buffers of keys named again once all are in. Done once every answer arrived.
  void pull(std::shared_ptr<out_batch> b, int priority, done_fn done) {
    auto plan = std::make_shared<const frame_plan>(frames_of(*b));
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
  // Keys [lo, hi) of the call's server order go to `server` in one frame, with `elements`
  // values together.
  struct frame {
    int server = 0;
    std::size_t lo = 0, hi = 0;
    std::uint64_t elements = 0;
    std::size_t keys() const noexcept { return hi - lo; }
  };
  struct frame_plan {
    std::vector<std::uint32_t> order;  // the call's keys by server (indices into entries)
    std::vector<frame> frames;
  };

  // The keys grouped by server (a counting sort: linear), cut into frames of at most chunk_bytes
  // of entries and values and at most batch_frame_keys keys (at least one key each).
  template <class Batch>
  frame_plan frames_of(const Batch& b) const {
    const auto servers = static_cast<std::size_t>(client_.num_servers());
    std::vector<std::size_t> start(servers + 1, 0);
    for (const auto& e : b.entries) ++start[static_cast<std::size_t>(e.server) + 1];
    for (std::size_t s = 0; s < servers; ++s) start[s + 1] += start[s];
    frame_plan p;
    p.order.resize(b.size());
    std::vector<std::size_t> at(start.begin(), start.end() - 1);
    for (std::size_t j = 0; j < b.size(); ++j)
      p.order[at[static_cast<std::size_t>(b.entries[j].server)]++] = static_cast<std::uint32_t>(j);
    const std::size_t limit = client_.options().chunk_bytes;
    for (std::size_t s = 0; s < servers; ++s) {
      frame fr{static_cast<int>(s), start[s], start[s], 0};
      std::size_t bytes = 0;
      for (std::size_t k = start[s]; k < start[s + 1]; ++k) {
        const std::uint64_t n = b.entries[p.order[k]].total;
        const std::size_t add = wire::batch_entry_size + n * sizeof(T);
        if (k > fr.lo && (bytes + add > limit || k - fr.lo == batch_frame_keys)) {
          fr.hi = k;
          p.frames.push_back(fr);
          fr = {static_cast<int>(s), k, k, 0};
          bytes = 0;
        }
        bytes += add;
        fr.elements += n;
      }
      fr.hi = start[s + 1];
      if (fr.hi > fr.lo) p.frames.push_back(fr);
    }
    return p;
  }

  // How many keys ahead a walk over a frame's keys prefetches their records.
  static constexpr std::size_t prefetch_ahead = 8;

  // The frame's entries (wire::put_batch_entry), aux(entry) each. `ReadsRecord`: aux reads the
  // key's record (an init's rows), so the walk loads records a few keys ahead; a push's walk
  // (its counts are the key table's, entry::pushes) and a pull's read no record at all, nor may
  // a planned call's engine op have (engine::renew).
  template <bool ReadsRecord, class Batch, class Aux>
  static std::string entries(const Batch& b, const frame_plan& p, const frame& fr, Aux&& aux) {
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
  static void pack(transport::out_frame& f, const in_batch& b, const frame_plan& p,
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
                                           const Batch& b, const frame_plan& p, const frame& fr) {
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
    std::shared_ptr<const frame_plan> plan;
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
