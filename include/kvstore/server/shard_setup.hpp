// A shard's keys set up and carried over: inits (a new slice counted against the server's bounds
// before it is made), the optimizer and a key's multipliers, optimizer states saved and loaded,
// and a whole state adopted from a snapshot. Apart from pushes and pulls, which serve keys that
// exist.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/server/shard_core.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/server/states.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace kvstore::detail {

/// The layer of shard<Port> (server/shard.hpp) over shard_core that sets keys up.
template <class Port>
class shard_setup : public shard_core<Port> {
 public:
  using shard_core<Port>::shard_core;
  using typename shard_core<Port>::slice;
  using typename shard_core<Port>::slice_map;
  using shard_core<Port>::key_overhead_bytes;
  using shard_core<Port>::key_str;

  /// One init frame: meta is the server's slice [lo, hi) of the key, h.aux the row length.
  /// Answered once the key has a value (the frame of rank 0 carries it).
  void init(int rank, const Port& from, const wire::header& h, std::string_view meta,
            std::span<const std::byte> payload) {
    const auto [lo, hi] = wire::decode_init_meta(meta);
    const std::uint64_t rl = h.aux;
    if (h.type != wire::dtype::f32 && h.type != wire::dtype::f64)
      throw error(errc::invalid_argument,
                  "key " + key_str(h.key) + ": init without an element type");
    // (hi - lo) * element size must not wrap: a wrapped size allocates a short value that later
    // writes overrun (found by fuzz/fuzz_server.cpp).
    if (h.total == 0 || lo >= hi || hi > h.total || (rl && (h.total % rl || lo % rl || hi % rl)) ||
        hi - lo > std::numeric_limits<std::size_t>::max() / 8)
      throw error(errc::invalid_argument, "key " + key_str(h.key) + ": bad slice [" +
                                              std::to_string(lo) + ", " + std::to_string(hi) +
                                              ") of " + std::to_string(h.total));
    if ((hi - lo) > cfg_.max_key_bytes / wire::dtype_size(h.type))
      throw error(errc::invalid_argument,
                  "key " + key_str(h.key) + ": a slice of " + std::to_string(hi - lo) +
                      " elements is more than this server's max_key_bytes (" +
                      std::to_string(cfg_.max_key_bytes) + ")");
    auto it = slices_.find(h.key);
    if (it != slices_.end()) {
      const slice& s = it->second;
      if (s.type != h.type || s.total != h.total || s.lo != lo || s.hi != hi || s.row_length != rl)
        throw error(errc::size_mismatch, "key " + key_str(h.key) + ": init with " +
                                             std::to_string(h.total) + " elements (row length " +
                                             std::to_string(rl) + ") but it was inited with " +
                                             std::to_string(s.total) + " (row length " +
                                             std::to_string(s.row_length) + ")");
    } else {
      admit_new_slice(h.key, (hi - lo) * wire::dtype_size(h.type));
      it = slices_.try_emplace(h.key).first;
      slice& s = it->second;
      s.key = h.key;
      s.type = h.type;
      s.total = h.total;
      s.lo = lo;
      s.hi = hi;
      s.row_length = rl;
      s.value = slice_value((hi - lo) * s.elem());
    }
    slice& s = it->second;
    if (s.restored && s.inited) {
      // Restored from a snapshot: an init re-sent after the restart is answered, not refused.
      if (h.flags & wire::flag_last) from.reply(h.req_id, errc::ok, {});
      return;
    }
    if (s.init_done.count(rank) || ((h.flags & wire::flag_has_data) && s.inited))
      throw error(errc::already_inited, "key " + key_str(h.key) + " is already inited");
    if (h.flags & wire::flag_has_data) {
      const std::uint64_t n = checks::check_range(s, h, payload.size());
      if (n)
        std::memcpy(s.value.data() + (h.offset - s.lo) * s.elem(), payload.data(), n * s.elem());
    }
    if (!(h.flags & wire::flag_last)) return;
    s.init_done.insert(rank);
    if (h.flags & wire::flag_has_data) {
      s.inited = true;
      changed(true);
      release_all(s.init_waiters, errc::ok, {});
      from.reply(h.req_id, errc::ok, {});
    } else if (s.inited) {
      from.reply(h.req_id, errc::ok, {});
    } else {
      s.init_waiters.push_back({from, h.req_id});
    }
  }

  /// Sets the optimizer by registered name and parameters. The same name again (new parameters:
  /// a learning-rate schedule, or every worker setting it) keeps every key's state; another name
  /// starts them afresh. Any worker may send it, any number of times.
  void set_optimizer(const Port& from, const wire::header& h, std::string_view meta) {
    auto [name, params] = wire::decode_optimizer(meta);
    auto f = optim::create_updater<float>(name, params);  // throws for unknown names, bad params
    auto d = optim::create_updater<double>(name, params);
    math_.use(std::move(f), std::move(d));
    if (name != opt_name_)
      for (auto& [k, s] : slices_) {
        s.st_f = {};
        s.st_d = {};
      }
    if (name != opt_name_ || params != opt_params_) {
      log_info(who_, "optimizer set: " + name);
      opt_name_ = name;
      opt_params_ = params;
      changed(true);
    }
    from.reply(h.req_id, errc::ok, {});
  }

  /// A key's learning-rate and weight-decay multipliers, for its updates from now on.
  void set_key_options(const Port& from, const wire::header& h, std::string_view meta) {
    slice& s = find(h);
    const auto m = wire::decode_key_multipliers(meta);
    s.mult = {m.lr_mult, m.wd_mult};
    changed(true);
    from.reply(h.req_id, errc::ok, {});
  }

  /// The shard's optimizer states (wire::decode_states' format) in one response, aux = entries.
  void save_states(const Port& from, const wire::header& h) {
    auto out = std::make_shared<bytes>();
    const std::uint64_t count = encode_states(slices_, *out);
    wire::header f;
    f.command = wire::cmd::response;
    f.req_id = h.req_id;
    f.aux = count;
    // The answer's text names the optimizer the states belong to: a worker that never set it
    // (rank 0 alone did) still writes the file for the right one.
    from.send(f, {out->data(), out->size()}, out, opt_name_);
  }

  /// Replaces the optimizer states of the keys in `payload` (save_states' format), saved for the
  /// optimizer named in `meta`; everything is checked before anything changes.
  void load_states(const Port& from, const wire::header& h, std::string_view meta,
                   std::span<const std::byte> payload) {
    if (meta.size() > wire::max_optimizer_name_len || meta != opt_name_)
      throw error(errc::invalid_argument, "the optimizer states were saved for optimizer \"" +
                                              std::string(meta.substr(0, 64)) + "\", " + who_ +
                                              " runs \"" + opt_name_ + "\"");
    replace_states(slices_, payload, who_);
    from.reply(h.req_id, errc::ok, {});
  }

  /// Replaces every slice and the optimizer (a restore). Throws, changing nothing, when the
  /// optimizer is unknown or its parameters are bad.
  void adopt(slice_map slices, const std::string& opt_name, const std::string& opt_params) {
    optim::updater<float> f;
    optim::updater<double> d;
    if (!opt_name.empty()) {
      f = optim::create_updater<float>(opt_name, opt_params);
      d = optim::create_updater<double>(opt_name, opt_params);
    }
    slices_ = std::move(slices);
    open_pushes_.clear();
    for (const auto& entry : slices_)
      entry.second.round_done.for_each([&](int r) { add_at(open_pushes_, r, 1); });
    held_.take_all();
    parked_.clear();
    waits_.clear();
    held_bytes_ = 0;
    for (const auto& entry : slices_)
      held_bytes_ += entry.second.size() * entry.second.elem() + key_overhead_bytes;
    math_.use(std::move(f), std::move(d));
    opt_name_ = opt_name;
    opt_params_ = opt_params;
  }

 protected:
  using typename shard_core<Port>::checks;
  using shard_core<Port>::changed;
  using shard_core<Port>::release_all;
  using shard_core<Port>::find;
  using shard_core<Port>::add_at;
  using shard_core<Port>::cfg_;
  using shard_core<Port>::held_bytes_;
  using shard_core<Port>::who_;
  using shard_core<Port>::slices_;
  using shard_core<Port>::math_;
  using shard_core<Port>::opt_name_;
  using shard_core<Port>::opt_params_;
  using shard_core<Port>::open_pushes_;
  using shard_core<Port>::held_;
  using shard_core<Port>::parked_;
  using shard_core<Port>::waits_;

  // A new slice of `bytes` must fit the key count and byte bounds, so a peer's inits cannot grow
  // the server without bound; refused before anything is allocated.
  void admit_new_slice(std::uint64_t key, std::uint64_t bytes) {
    if (slices_.size() >= cfg_.max_keys)
      throw error(errc::invalid_argument, "key " + key_str(key) + ": this server already holds " +
                                              std::to_string(slices_.size()) +
                                              " keys, its max_keys (KVSTORE_MAX_KEYS)");
    const std::uint64_t cost = bytes + key_overhead_bytes;
    if (cfg_.max_total_bytes &&
        (cost > cfg_.max_total_bytes || held_bytes_ > cfg_.max_total_bytes - cost))
      throw error(errc::invalid_argument,
                  "key " + key_str(key) + ": " + std::to_string(bytes) +
                      " more bytes would take this server past its max_total_bytes (" +
                      std::to_string(cfg_.max_total_bytes) + ", KVSTORE_MAX_TOTAL_BYTES; " +
                      std::to_string(held_bytes_) + " held)");
    held_bytes_ += cost;
  }
};

}  // namespace kvstore::detail
