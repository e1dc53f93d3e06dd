// A worker's requests, built into frames: a key's init, push, pull and rows over the servers that
// hold its slices (values cut into chunk_bytes frames), and every server's optimizer states. The
// calls that carry no key's values (optimizer, commands, leave, checkpoint, barrier, dead nodes)
// are the base's, client/control_requests.hpp, which needs no T.
// The API layer (dist.hpp) checks arguments and orders ops per key; this turns one op into
// frames for worker_client and runs the op's continuation once every server answered.
#pragma once

#include <kvstore/client/call.hpp>
#include <kvstore/client/client.hpp>
#include <kvstore/client/compression.hpp>
#include <kvstore/client/control_requests.hpp>
#include <kvstore/client/key_record.hpp>
#include <kvstore/client/row_fanout.hpp>
#include <kvstore/detail/block_pool.hpp>
#include <kvstore/error.hpp>
#include <kvstore/op.hpp>
#include <kvstore/optim/state_file.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::detail {

template <class T>
class requests : public control_requests {
  static constexpr wire::dtype dtype = wire::dtype_of<T>();

 public:
  /// The record of a key id, or nullptr when the store has no such key.
  using key_lookup = std::function<const key_record*(std::uint64_t)>;

  explicit requests(worker_client& c)
      : control_requests(c),
        chunk_elems_(std::max<std::size_t>(1, c.options().chunk_bytes / sizeof(T))) {}

  // ---- one key's data ----------------------------------------------------------------------
  /// Every worker sends its slices' init; rank 0's carry the value (`with_data`).
  void init(const key_record& m, std::span<const T> value, bool with_data, done_fn done) {
    auto all = fan_in(m.slices.size(), std::move(done));
    const auto& o = client_.options();
    for (auto& s : m.slices) {
      std::vector<transport::out_frame> frames;
      const std::string meta = wire::encode_init_meta({s.lo, s.hi});
      auto frame = [&](std::uint64_t off, std::uint64_t n, bool last) {
        transport::out_frame f;
        f.h = wire::init_header(fields(m), m.row_length, off, last, with_data);
        f.meta = meta;
        if (with_data) set_payload(f, value.data() + off, n);
        frames.push_back(std::move(f));
      };
      if (with_data) {
        for (std::uint64_t off = s.lo; off < s.hi; off += chunk_elems_)
          frame(off, std::min<std::uint64_t>(chunk_elems_, s.hi - off), off + chunk_elems_ >= s.hi);
      } else {
        frame(s.lo, 0, true);
      }
      worker_client::request r = part_of(all, {call_kind::init, &m.k});
      r.timeout = o.connect_timeout + o.request_timeout;
      client_.send(s.server, std::move(frames), std::move(r));
    }
  }

  /// The value of a key, a slice to each server in chunk_bytes frames. `keep` holds a buffer the
  /// value points into until the frames are written.
  void push(key_record& m, std::span<const T> value, int priority, done_fn done,
            std::shared_ptr<const void> keep = nullptr) {
    auto all = fan_in(m.slices.size(), std::move(done));
    const std::uint64_t seq = next_push_seq(*m.pushes);
    if (const compression c = compression_.of(m); c.type != compression::none)
      return push_encoded(m, value, c, priority, seq, std::move(all));
    for (auto& s : m.slices) {
      auto frame_at = [&](std::uint64_t off) {
        const std::uint64_t n = std::min<std::uint64_t>(chunk_elems_, s.hi - off);
        transport::out_frame f;
        f.h = wire::push_header(fields(m), off, seq, off + n >= s.hi, priority);
        set_payload(f, value.data() + off, n);
        f.keep = keep;
        return f;
      };
      if (s.hi - s.lo <= chunk_elems_) {  // one frame: no vector of frames
        client_.send(s.server, frame_at(s.lo),
                     part_of(share(all, &s == &m.slices.back()), {call_kind::push, &m.k}));
        continue;
      }
      std::vector<transport::out_frame> frames;
      for (std::uint64_t off = s.lo; off < s.hi; off += chunk_elems_)
        frames.push_back(frame_at(off));
      client_.send(s.server, std::move(frames),
                   part_of(share(all, &s == &m.slices.back()), {call_kind::push, &m.k}));
    }
  }

  /// Every server's slice lands straight in outs[0]; the other outputs get a copy. Each server
  /// answers once its slice reached `min_version` (0: at once).
  void pull(const key_record& m, std::vector<std::span<T>> outs, int priority, done_fn done,
            std::uint64_t min_version = 0) {
    auto first = outs.front();
    auto all = fan_in(m.slices.size(), [outs = std::move(outs), done = std::move(done)](auto e) {
      if (!e)
        for (std::size_t i = 1; i < outs.size(); ++i)
          std::copy(outs[0].begin(), outs[0].end(), outs[i].begin());
      done(e);
    });
    if (const auto e = pull_encoding(compression_.of(m)); e != wire::encoding::plain)
      return pull_encoded(m, first, e, priority, min_version, std::move(all));
    for (auto& s : m.slices) {
      transport::out_frame f;
      f.h = wire::pull_header(fields(m), s.lo, priority, min_version);
      worker_client::request r =
          part_of(share(all, &s == &m.slices.back()), {call_kind::pull, &m.k, -1, min_version});
      r.out = reinterpret_cast<std::byte*>(first.data());
      r.out_bytes = first.size() * sizeof(T);
      r.elem = sizeof(T);
      client_.send(s.server, std::move(f), std::move(r));
    }
  }

  /// The named rows, each to the server holding it. Every server of the key gets a message,
  /// possibly empty, so a sync round counts this worker everywhere.
  void push_rows(key_record& m, std::span<const std::int64_t> rows, std::span<const T> values,
                 int priority, done_fn done) {
    auto all = fan_in(m.slices.size(), std::move(done));
    const std::uint64_t rl = m.row_length;
    const std::size_t per =
        std::max<std::size_t>(1, client_.options().chunk_bytes / (rl * sizeof(T)));
    const std::uint64_t seq = next_push_seq(*m.pushes);
    for (auto& s : m.slices) {
      auto ids = std::make_shared<std::vector<std::int64_t>>();
      auto vals = std::make_shared<std::vector<T>>();
      for (std::size_t i = 0; i < rows.size(); ++i)
        if (owns_row(s, rl, rows[i])) {
          ids->push_back(rows[i]);
          vals->insert(vals->end(), values.begin() + static_cast<std::ptrdiff_t>(i * rl),
                       values.begin() + static_cast<std::ptrdiff_t>((i + 1) * rl));
        }
      std::vector<transport::out_frame> frames;
      std::size_t i = 0;
      do {
        const std::size_t n = std::min(per, ids->size() - i);
        transport::out_frame f;
        f.h = wire::push_rows_header(fields(m), seq, i + n >= ids->size(), priority);
        f.meta = wire::encode_rows(ids->data() + i, n);
        set_payload(f, vals->data() + i * rl, n * rl);
        f.keep = vals;
        frames.push_back(std::move(f));
        i += n;
      } while (i < ids->size());
      client_.send(s.server, std::move(frames), part_of(all, {call_kind::push_rows, &m.k}));
    }
  }

  /// The named rows from the servers holding them, each into its place in `out`.
  void pull_rows(const key_record& m, std::span<const std::int64_t> rows, std::span<T> out,
                 int priority, done_fn done) {
    const std::uint64_t rl = m.row_length;
    std::vector<std::pair<const slice_ref*, std::shared_ptr<const row_fanout>>> asks;
    for (auto& s : m.slices) {
      auto f = std::make_shared<row_fanout>(
          row_fanout::of(rows, [&](std::int64_t r) { return owns_row(s, rl, r); }));
      if (!f->ids.empty()) asks.emplace_back(&s, std::move(f));
    }
    if (asks.empty()) return done(nullptr);
    auto all = fan_in(asks.size(), std::move(done));
    for (auto& ask : asks) {
      // Named, not structured bindings: clang 14 cannot capture those in a lambda.
      const slice_ref* s = ask.first;
      const auto& fan = ask.second;
      transport::out_frame f;
      f.h = wire::pull_rows_header(fields(m), priority);
      f.meta = wire::encode_rows(fan->ids.data(), fan->ids.size());
      worker_client::request r = part_of(all, {call_kind::pull_rows, &m.k});
      r.on_data = [fan, out, rl](const wire::header& h, std::span<const std::byte> payload) {
        const std::size_t n = payload.size() / (rl * sizeof(T));
        if (h.offset > fan->ids.size() || n > fan->ids.size() - h.offset ||
            payload.size() != n * rl * sizeof(T))
          throw error(errc::protocol, "pull_rows answer does not match the request");
        const T* src = reinterpret_cast<const T*>(payload.data());
        for (std::size_t j = 0; j < n; ++j) {
          const std::size_t d = h.offset + j;
          for (std::size_t p = fan->first[d]; p < fan->first[d + 1]; ++p)
            std::memcpy(out.data() + fan->positions[p] * rl, src + j * rl, rl * sizeof(T));
        }
      };
      client_.send(s->server, std::move(f), std::move(r));
    }
  }

  // ---- compression -------------------------------------------------------------------------
  /// The store's compression (set_gradient_compression): pushes and pulls of keys without their
  /// own (init_options::compression) use it from their next op on.
  void set_compression(const compression& c) noexcept { compression_.set(c); }
  compression store_compression() const noexcept { return compression_.get(); }
  /// Whether key m's pushes (`pull` false) or pulls travel plain, uncompressed (the batched
  /// path carries only those).
  bool travels_plain(const key_record& m, bool pull) const noexcept {
    const compression c = compression_.of(m);
    return pull ? pull_encoding(c) == wire::encoding::plain : c.type == compression::none;
  }

  // ---- element ranges of one key --------------------------------------------------------------
  /// Elements [offset, offset + values.size()) of the key, each server's part in chunk_bytes
  /// frames, only to the servers whose slices the range overlaps. One push number for the lot:
  /// in dist_sync it is this worker's push of every slice it touches.
  void push_range(key_record& m, std::uint64_t offset, std::span<const T> values, int priority,
                  done_fn done) {
    const auto parts = overlaps(m, offset, values.size());
    auto all = fan_in(parts.size(), std::move(done));
    const std::uint64_t seq = next_push_seq(*m.pushes);
    for (auto& p : parts) {
      const std::string meta = wire::encode_range({p.lo, p.hi - p.lo});
      std::vector<transport::out_frame> frames;
      for (std::uint64_t off = p.lo; off < p.hi; off += chunk_elems_) {
        const std::uint64_t n = std::min<std::uint64_t>(chunk_elems_, p.hi - off);
        transport::out_frame f;
        f.h = wire::push_range_header(fields(m), off, seq, off + n >= p.hi, priority);
        f.meta = meta;
        set_payload(f, values.data() + (off - offset), n);
        frames.push_back(std::move(f));
      }
      client_.send(p.server, std::move(frames), part_of(all, {call_kind::push_range, &m.k}));
    }
  }

  /// Elements [offset, offset + out.size()) of the key: each overlapped server's part lands
  /// straight in its place in `out`.
  void pull_range(const key_record& m, std::uint64_t offset, std::span<T> out, int priority,
                  done_fn done) {
    const auto parts = overlaps(m, offset, out.size());
    auto all = fan_in(parts.size(), std::move(done));
    for (auto& p : parts) {
      transport::out_frame f;
      f.h = wire::pull_range_header(fields(m), p.lo, priority);
      f.meta = wire::encode_range({p.lo, p.hi - p.lo});
      worker_client::request r = part_of(all, {call_kind::pull_range, &m.k});
      // The answer's offsets count from the part's first element.
      r.out = reinterpret_cast<std::byte*>(out.data() + (p.lo - offset));
      r.out_bytes = (p.hi - p.lo) * sizeof(T);
      r.elem = sizeof(T);
      client_.send(p.server, std::move(f), std::move(r));
    }
  }

  /// A key's learning-rate and weight-decay multipliers, to every server holding a slice of it;
  /// returns once all have them.
  void set_key_options(const key_record& m, double lr_mult, double wd_mult) {
    auto all = make_pooled<op_state>(m.slices.size());
    all->spin_us = spin_us_;
    const std::string meta = wire::encode_key_multipliers({lr_mult, wd_mult});
    for (auto& s : m.slices) {
      transport::out_frame f;
      f.h = wire::key_options_header(fields(m));
      f.meta = meta;
      client_.send(s.server, std::move(f), part_of(all, {call_kind::set_key_options, &m.k}));
    }
    op(all).wait();
  }

  /// The key's version: the least of its slices' (each server's answer's aux), into `*out`.
  void version(const key_record& m, std::shared_ptr<std::uint64_t> out, done_fn done) {
    *out = std::numeric_limits<std::uint64_t>::max();
    auto all = fan_in(m.slices.size(), std::move(done));
    for (auto& s : m.slices) {
      transport::out_frame f;
      f.h = wire::version_header(fields(m));
      worker_client::request r = part_of(all, {call_kind::version, &m.k});
      // Answers are read on the client's one io thread: no two of them race on *out.
      r.on_response = [out](const wire::header& h, std::span<const std::byte>) {
        *out = std::min(*out, h.aux);
      };
      client_.send(s.server, std::move(f), std::move(r));
    }
  }

  // ---- every server; each call blocks until all answered ------------------------------------
  /// Every server's optimizer states, joined into whole keys, and in `optimizer` the name of the
  /// optimizer they belong to (the servers', whoever set it). A state that matches no key of
  /// `lookup`, or servers running different optimizers, is a protocol error.
  std::map<std::uint64_t, optim::key_state<T>> save_states(const key_lookup& lookup,
                                                           std::string& optimizer) {
    std::map<std::uint64_t, optim::key_state<T>> states;
    std::mutex m;
    std::vector<std::string> names;
    to_all_servers(
        call_kind::save_optimizer_states,
        [](int) {
          transport::out_frame f;
          f.h = wire::plain(wire::cmd::save_states);
          return f;
        },
        [&](const wire::header&, std::span<const std::byte> payload) {
          std::lock_guard lk(m);
          for (const auto& e : wire::decode_states(
                   {reinterpret_cast<const char*>(payload.data()), payload.size()})) {
            const key_record* rec = lookup(e.key);
            if (e.type != dtype || !rec || rec->total != e.total)
              throw error(errc::protocol,
                          "save_optimizer_states: a server sent a state that matches no key");
            auto& ks = states[e.key];
            ks.name = rec->k.name();
            ks.st.step = std::max(ks.st.step, e.step);
            if (ks.st.slots.size() < e.nslots)
              ks.st.slots.resize(e.nslots, std::vector<T>(e.total, T{}));
            for (std::uint32_t s = 0; s < e.nslots; ++s) {
              auto raw = e.slot(s);
              std::memcpy(ks.st.slots[s].data() + e.lo, raw.data(), raw.size());
            }
          }
        },
        [&](std::string_view name) {
          std::lock_guard lk(m);
          names.emplace_back(name);
        });
    for (auto& n : names)
      if (n != names.front())
        throw error(errc::protocol,
                    "save_optimizer_states: the servers run different optimizers (\"" +
                        names.front() + "\" and \"" + n + "\")");
    optimizer = names.empty() ? std::string() : names.front();
    return states;
  }

  /// Gives each server its slices of `states` (checked against the keys by the caller), saved
  /// for `optimizer`: a server running another one refuses them.
  void load_states(const std::map<std::uint64_t, optim::key_state<T>>& states,
                   const key_lookup& lookup, const std::string& optimizer) {
    auto parts =
        std::make_shared<std::vector<std::string>>(static_cast<std::size_t>(num_servers()));
    for (auto& [id, ks] : states) {
      const key_record& rec = *lookup(id);
      for (auto& s : rec.slices) {
        auto& p = (*parts)[static_cast<std::size_t>(s.server)];
        p += wire::encode_state_head(id, dtype, s.lo, s.hi, rec.total, ks.st.step,
                                     static_cast<std::uint32_t>(ks.st.slots.size()));
        for (auto& sl : ks.st.slots)
          p.append(reinterpret_cast<const char*>(sl.data() + s.lo), (s.hi - s.lo) * sizeof(T));
      }
    }
    to_all_servers(call_kind::load_optimizer_states, [&](int s) {
      transport::out_frame f;
      f.h = wire::plain(wire::cmd::load_states);
      f.meta = optimizer;
      auto& b = (*parts)[static_cast<std::size_t>(s)];
      f.payload = reinterpret_cast<const std::byte*>(b.data());
      f.payload_len = b.size();
      f.keep = parts;
      return f;
    });
  }

 private:
  static wire::key_fields fields(const key_record& m) { return {m.k.id(), m.total, dtype}; }

  static void set_payload(transport::out_frame& f, const T* p, std::uint64_t n) {
    f.payload = reinterpret_cast<const std::byte*>(p);
    f.payload_len = n * sizeof(T);
  }

  // A push in encoding c: each slice's frames of at most chunk_bytes of encoded payload, all
  // encoded into one buffer before any is sent (two_bit: against the key's residual).
  void push_encoded(key_record& m, std::span<const T> value, const compression& c, int priority,
                    std::uint64_t seq, std::shared_ptr<op_state> all) {
    const wire::encoding e = push_encoding(c);
    const std::size_t per = elements_per_frame(e, client_.options().chunk_bytes);
    encoded_push<T> enc(e, c.threshold);
    for (auto& s : m.slices)
      for (std::uint64_t off = s.lo; off < s.hi; off += per)
        enc.add(off, std::min<std::uint64_t>(per, s.hi - off));
    auto buf = push_buffer(m, enc.size());
    enc.encode(value, e == wire::encoding::two_bit ? residual_of<T>(m) : nullptr, *buf);
    auto frame = enc.frames().begin();
    for (auto& s : m.slices) {
      std::vector<transport::out_frame> frames;
      for (; frame != enc.frames().end() && frame->offset < s.hi; ++frame) {
        transport::out_frame f;
        f.h = wire::push_header(fields(m), frame->offset, seq, frame->offset + frame->count >= s.hi,
                                priority);
        f.h.flags |= wire::encoding_flags(e);
        f.payload = buf->data() + frame->at;
        f.payload_len = frame->bytes;
        f.keep = buf;
        frames.push_back(std::move(f));
      }
      client_.send(s.server, std::move(frames), part_of(all, {call_kind::push, &m.k}));
    }
  }

  // A pull whose answer travels in 16-bit encoding e: each data frame decoded into `out` at its
  // offset, which must lie in the slice asked for.
  void pull_encoded(const key_record& m, std::span<T> out, wire::encoding e, int priority,
                    std::uint64_t min_version, std::shared_ptr<op_state> all) {
    for (auto& s : m.slices) {
      transport::out_frame f;
      f.h = wire::pull_header(fields(m), s.lo, priority, min_version);
      f.h.flags |= wire::encoding_flags(e);
      worker_client::request r = part_of(all, {call_kind::pull, &m.k, -1, min_version});
      r.on_data = [out, e, lo = s.lo, hi = s.hi](const wire::header& h,
                                                 std::span<const std::byte> payload) {
        const std::uint64_t n = payload.size() / 2;
        if (wire::encoding_bits(h.flags) != static_cast<unsigned>(e) ||
            (h.flags & wire::flag_rows) || h.offset < lo || h.offset > hi || n > hi - h.offset ||
            payload.size() % 2)
          throw error(errc::protocol, std::string("a ") + wire::encoding_name(e) +
                                          " pull's answer does not match the request");
        wire::decode_16bit<false>(e, payload.data(), n, out.data() + h.offset);
      };
      client_.send(s.server, std::move(f), std::move(r));
    }
  }

  // The parts of elements [offset, offset + n) on the servers holding them, in key order (the
  // range is checked to lie in the key, so the parts are never empty together).
  static std::vector<slice_ref> overlaps(const key_record& m, std::uint64_t offset,
                                         std::uint64_t n) {
    std::vector<slice_ref> parts;
    for (auto& s : m.slices) {
      const std::uint64_t lo = std::max(s.lo, offset), hi = std::min(s.hi, offset + n);
      if (lo < hi) parts.push_back({s.server, lo, hi});
    }
    return parts;
  }

  // Rows of slice `s` of a matrix key.
  static bool owns_row(const slice_ref& s, std::uint64_t rl, std::int64_t row) {
    const auto r = static_cast<std::uint64_t>(row);
    return r * rl >= s.lo && r * rl < s.hi;
  }

  compression_setting compression_;
  const std::size_t chunk_elems_;
};

}  // namespace kvstore::detail
