// The shard without a socket, for unit tests: requests built by hand, answers in an outbox per
// worker (test_shard.cpp, test_shard_batch.cpp).
#pragma once

#include <kvstore/server/shard.hpp>
#include <kvstore/server/snapshots.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/messages.hpp>
#include <kvstore/wire/meta.hpp>
#include <kvstore/wire/snapshot.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kvtest_shard {

using kvstore::errc;
namespace wire = kvstore::wire;
namespace optim = kvstore::optim;

/// One answer the shard sent: a response (status, message) or a frame with a payload.
struct answer {
  wire::header h;
  errc status = errc::ok;
  std::string message;
  std::vector<float> values;  // the payload read as floats (data frames)
  std::string raw;            // the payload's bytes
  bool data = false;
};

struct outbox {
  std::vector<answer> got;
};

/// The test's Port: answers go to a worker's outbox.
struct box_port {
  std::shared_ptr<outbox> box;
  void reply(std::uint64_t req, errc status, std::string msg) const {
    answer a;
    a.h.req_id = req;
    a.status = status;
    a.message = std::move(msg);
    box->got.push_back(std::move(a));
  }
  bool same_peer(const box_port& o) const { return box == o.box; }
  void send(const wire::header& h, std::span<const std::byte> payload,
            std::shared_ptr<const void> keep, std::string meta = {}) const {
    CHECK((payload.empty() || keep != nullptr));
    answer a;
    a.h = h;
    a.message = std::move(meta);
    a.status = static_cast<errc>(h.status);
    a.data = h.command == wire::cmd::data;
    a.raw.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
    a.values.resize(payload.size() / sizeof(float));
    if (!a.values.empty())
      std::memcpy(a.values.data(), payload.data(), a.values.size() * sizeof(float));
    box->got.push_back(std::move(a));
  }
};

using shard_t = kvstore::detail::shard<box_port>;

inline std::span<const std::byte> bytes_of(const std::vector<float>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)};
}

/// A shard and one port per worker.
struct fixture {
  explicit fixture(int workers, bool sync = true, std::size_t chunk_bytes = 1 << 20)
      : fixture(config(workers, sync, chunk_bytes)) {}
  explicit fixture(kvstore::detail::shard_config c)
      : sh(c, [this](bool important, std::uint64_t n) {
          changes.push_back(important);
          counts.push_back(n);
          if (on_change) on_change();
        }) {
    for (int r = 0; r < c.num_workers; ++r) ports.push_back({std::make_shared<outbox>()});
  }
  static kvstore::detail::shard_config config(int workers, bool sync, std::size_t chunk_bytes) {
    kvstore::detail::shard_config c;
    c.num_workers = workers;
    c.sync = sync;
    c.chunk_bytes = chunk_bytes;
    return c;
  }

  std::vector<answer>& got(int rank) { return ports[static_cast<std::size_t>(rank)].box->got; }
  const box_port& port(int rank) { return ports[static_cast<std::size_t>(rank)]; }

  /// Every worker inits `key` ([lo, hi) of `total` on this server; rank 0 sends `value`).
  void init_all(std::uint64_t key, const std::vector<float>& value, std::uint64_t lo,
                std::uint64_t hi, std::uint64_t total, std::uint64_t row_length = 0) {
    for (int r = 0; r < static_cast<int>(ports.size()); ++r)
      init(r, key, r == 0 ? value : std::vector<float>{}, lo, hi, total, row_length);
    for (int r = 0; r < static_cast<int>(ports.size()); ++r) {
      REQUIRE(got(r).size() == 1);
      REQUIRE(got(r).back().status == errc::ok);
      got(r).clear();
    }
  }
  void init(int rank, std::uint64_t key, const std::vector<float>& value, std::uint64_t lo,
            std::uint64_t hi, std::uint64_t total, std::uint64_t row_length = 0) {
    wire::header h;
    h.command = wire::cmd::init;
    h.key = key;
    h.req_id = ++req;
    h.type = wire::dtype::f32;
    h.total = total;
    h.offset = lo;
    h.aux = row_length;
    h.flags = wire::flag_last | (value.empty() ? 0u : wire::flag_has_data);
    h.payload_len = value.size() * sizeof(float);
    sh.handle(rank, port(rank), h, wire::encode_init_meta({lo, hi}), bytes_of(value));
  }

  wire::header push_header(std::uint64_t key, std::uint64_t offset, std::size_t n,
                           std::uint64_t total, std::uint64_t seq = 0, bool last = true) {
    wire::header h;
    h.command = wire::cmd::push;
    h.key = key;
    h.req_id = ++req;
    h.type = wire::dtype::f32;
    h.total = total;
    h.offset = offset;
    h.aux = seq;
    h.flags = last ? wire::flag_last : 0u;
    h.payload_len = n * sizeof(float);
    return h;
  }
  /// One frame of a push of elements [offset, offset + v.size()).
  void push(int rank, std::uint64_t key, const std::vector<float>& v, std::uint64_t offset,
            std::uint64_t total, std::uint64_t seq = 0, bool last = true) {
    sh.handle(rank, port(rank), push_header(key, offset, v.size(), total, seq, last), {},
              bytes_of(v));
  }
  void push_rows(int rank, std::uint64_t key, const std::vector<std::int64_t>& rows,
                 const std::vector<float>& v, std::uint64_t total, std::uint64_t seq = 0) {
    wire::header h = push_header(key, 0, v.size(), total, seq);
    h.command = wire::cmd::push_rows;
    sh.handle(rank, port(rank), h, wire::encode_rows(rows.data(), rows.size()), bytes_of(v));
  }

  /// The value a pull of `key` answers, put together from its data frames.
  std::vector<float> pull(std::uint64_t key, std::uint64_t total, std::uint64_t lo = 0,
                          int rank = 0) {
    auto& g = got(rank);
    g.clear();
    const std::uint64_t id = send_pull(rank, key, total);
    std::vector<float> out;
    for (std::size_t i = 0; i < g.size(); ++i) {
      REQUIRE(g[i].data);
      CHECK(g[i].h.req_id == id);
      CHECK(g[i].h.offset == lo + out.size());
      CHECK(((g[i].h.flags & wire::flag_last) != 0) == (i + 1 == g.size()));
      out.insert(out.end(), g[i].values.begin(), g[i].values.end());
    }
    g.clear();
    return out;
  }
  std::vector<float> pull_rows(std::uint64_t key, const std::vector<std::int64_t>& rows,
                               std::uint64_t total) {
    wire::header h;
    h.command = wire::cmd::pull_rows;
    h.key = key;
    h.req_id = ++req;
    h.type = wire::dtype::f32;
    h.total = total;
    auto& g = got(0);
    g.clear();
    sh.handle(0, port(0), h, wire::encode_rows(rows.data(), rows.size()), {});
    std::vector<float> out;
    for (auto& a : g) {
      REQUIRE(a.data);
      CHECK((a.h.flags & wire::flag_rows) != 0);
      out.insert(out.end(), a.values.begin(), a.values.end());
    }
    g.clear();
    return out;
  }
  void set_optimizer(const std::string& name, const std::string& params) {
    wire::header h;
    h.command = wire::cmd::set_optimizer;
    h.req_id = ++req;
    sh.handle(0, port(0), h, wire::encode_optimizer({name, params}), {});
    REQUIRE(got(0).size() == 1);
    REQUIRE(got(0).back().status == errc::ok);
    got(0).clear();
  }
  /// Sets `key`'s learning-rate and weight-decay multipliers.
  void set_key_options(std::uint64_t key, std::uint64_t total, double lr, double wd) {
    wire::header h = wire::key_options_header({key, total, wire::dtype::f32});
    h.req_id = ++req;
    sh.handle(0, port(0), h, wire::encode_key_multipliers({lr, wd}), {});
    REQUIRE(got(0).size() == 1);
    REQUIRE(got(0).back().status == errc::ok);
    got(0).clear();
  }
  /// The save_states answer's payload and entry count; its text (the optimizer's name) in
  /// saved_for.
  std::pair<std::string, std::uint64_t> save_states() {
    wire::header h;
    h.command = wire::cmd::save_states;
    h.req_id = ++req;
    got(0).clear();
    sh.handle(0, port(0), h, {}, {});
    REQUIRE(got(0).size() == 1);
    auto a = got(0).back();
    got(0).clear();
    CHECK(a.h.command == wire::cmd::response);
    saved_for = a.message;
    return {a.raw, a.h.aux};
  }
  /// Loads states saved for the optimizer `name` (default: the shard's own).
  void load_states(const std::string& payload, std::optional<std::string> name = std::nullopt) {
    wire::header h;
    h.command = wire::cmd::load_states;
    h.req_id = ++req;
    h.payload_len = payload.size();
    sh.handle(0, port(0), h, name ? *name : sh.optimizer_name(),
              {reinterpret_cast<const std::byte*>(payload.data()), payload.size()});
  }
  std::string saved_for;

  /// Sends a pull of `key` from `rank` asking for `min_version`, without reading the answer.
  std::uint64_t send_pull(int rank, std::uint64_t key, std::uint64_t total,
                          std::uint64_t min_version = 0) {
    wire::header h;
    h.command = wire::cmd::pull;
    h.key = key;
    h.req_id = ++req;
    h.type = wire::dtype::f32;
    h.total = total;
    h.aux = min_version;
    sh.handle(rank, port(rank), h, {}, {});
    return h.req_id;
  }
  /// The value of the answer to request `req_id` in `rank`'s outbox (empty: not answered);
  /// the answer's frames are taken out of the outbox.
  std::vector<float> answer_of(int rank, std::uint64_t req_id) {
    auto& g = got(rank);
    std::vector<float> out;
    bool last = false;
    for (auto it = g.begin(); it != g.end();) {
      if (it->h.req_id != req_id || !it->data) {
        ++it;
        continue;
      }
      out.insert(out.end(), it->values.begin(), it->values.end());
      last = (it->h.flags & wire::flag_last) != 0;
      it = g.erase(it);
    }
    REQUIRE((out.empty() || last));
    return out;
  }
  /// The slice's version, as the version command answers it.
  std::uint64_t version(std::uint64_t key, std::uint64_t total, int rank = 0) {
    wire::header h;
    h.command = wire::cmd::version;
    h.key = key;
    h.req_id = ++req;
    h.type = wire::dtype::f32;
    h.total = total;
    sh.handle(rank, port(rank), h, {}, {});
    REQUIRE(!got(rank).empty());
    auto a = got(rank).back();
    got(rank).pop_back();
    REQUIRE(a.h.command == wire::cmd::response);
    REQUIRE(a.status == errc::ok);
    CHECK(a.h.req_id == h.req_id);
    return a.h.aux;
  }

  shard_t sh;
  std::vector<box_port> ports;
  std::vector<bool> changes;          // each change report: important?
  std::vector<std::uint64_t> counts;  // and how many changes it reported
  std::function<void()> on_change;    // runs at each report
  std::uint64_t req = 0;
};

/// The responses to request `id` in `rank`'s outbox (taken out).
inline std::vector<answer> responses(fixture& f, int rank, std::uint64_t id) {
  std::vector<answer> out;
  auto& g = f.got(rank);
  for (auto it = g.begin(); it != g.end();) {
    if (it->h.req_id == id && !it->data) {
      out.push_back(*it);
      it = g.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

inline errc code_of(const kvstore::error& e) { return static_cast<errc>(e.code().value()); }

template <class F>
errc error_of(F&& f) {
  try {
    f();
  } catch (const kvstore::error& e) {
    return code_of(e);
  }
  return errc::ok;
}

inline std::string params_of(const auto& o) { return optim::make_updater<float>(o).params; }

}  // namespace kvtest_shard
