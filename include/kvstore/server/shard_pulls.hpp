// A shard's pulls: a key's value, rows or a range, and its version, answered at once or held until
// the version asked for is reached or slower workers catch up (server/pull_gate.hpp says when);
// held pulls are answered as rounds complete, expire at their deadline, and fail when a worker
// dies in dist_sync.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/server/held_pulls.hpp>
#include <kvstore/server/pull_gate.hpp>
#include <kvstore/server/request_checks.hpp>
#include <kvstore/server/shard_setup.hpp>
#include <kvstore/server/value_answers.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvstore::detail {

/// The layer of shard<Port> (server/shard.hpp) that answers pulls and holds those that wait.
template <class Port>
class shard_pulls : public shard_setup<Port> {
 public:
  using shard_setup<Port>::shard_setup;
  using typename shard_setup<Port>::slice;
  using shard_setup<Port>::key_str;

  /// The slice's value, in data frames of at most chunk_bytes (the last flagged); held first
  /// while the slice is below the version in h.aux or the puller is too far ahead (staleness).
  void pull(int rank, const Port& from, const wire::header& h) {
    if (parks(rank, h)) return park(rank, from, h, {}, {});
    slice& s = find(h);
    // A pull in an encoding the server cannot answer is refused now, not once it is released.
    if (wire::encoding_bits(h.flags)) (void)checks::pull_encoding(h);
    if (!may_answer(rank, s, h.aux)) return hold({from, rank, h, {}, {}});
    answers::send_value(from, h, s, cfg_.chunk_bytes);
  }

  /// The rows listed in meta, in data frames (offset: index of the frame's first row in the
  /// list); held as a pull is.
  void pull_rows(int rank, const Port& from, const wire::header& h, std::string_view meta) {
    slice& s = find(h);
    auto rows = checks::check_rows(s, h, meta);
    // Each row at most once (workers ask for distinct rows and copy repeats themselves), so an
    // answer is never bigger than the slice: naming one row 50,000 times would make the server
    // copy it 50,000 times.
    checks::refuse_repeated_rows(h.key, rows);
    if (!may_answer(rank, s, h.aux)) return hold({from, rank, h, std::move(rows), {}});
    answers::send_rows(from, h, s, rows, cfg_.chunk_bytes);
  }

  /// A range pull: the elements its meta names (wire::range_meta, inside the slice), answered
  /// as value_answers::send_range says; held as a pull is.
  void pull_range(int rank, const Port& from, const wire::header& h, std::string_view meta) {
    slice& s = find(h);
    const wire::range_meta r = checks::range_in_slice(s, h, meta, who_);
    if (!may_answer(rank, s, h.aux)) {
      held_pull<Port> p{from, rank, h, {}, {}};
      p.range_offset = r.offset;
      p.range_length = r.length;
      return hold(std::move(p));
    }
    answers::send_range(from, h, s, r, cfg_.chunk_bytes);
  }

  /// The slice's version (rounds completed, or async pushes applied) as the response's aux.
  void version(const Port& from, const wire::header& h) {
    const slice& s = find(h);
    wire::header f;
    f.command = wire::cmd::response;
    f.req_id = h.req_id;
    f.aux = s.round;
    from.send(f, {}, nullptr);
  }

  // ---- held pulls (versions and bounded staleness) --------------------------------------------

  /// Answers the held pulls whose deadline passed at `now` with a timeout naming the key and what
  /// it waited for. Returns the next deadline, if pulls are still held.
  std::optional<std::chrono::steady_clock::time_point> expire_held(
      std::chrono::steady_clock::time_point now) {
    for (auto& p : held_.take_expired(now))
      p.port.reply(p.h.req_id, errc::timeout,
                   why_held(p) + " for " + std::to_string(cfg_.hold_timeout.count()) +
                       " ms, this server's limit");
    return held_.next_deadline();
  }
  std::optional<std::chrono::steady_clock::time_point> next_held_deadline() const {
    return held_.next_deadline();
  }
  /// How many pulls are held (of worker `rank`, or of all).
  std::size_t held(int rank) const { return held_.count(rank); }
  std::size_t held() const { return held_.size(); }

 protected:
  using typename shard_setup<Port>::checks;
  using typename shard_setup<Port>::answers;
  using shard_setup<Port>::find;
  using shard_setup<Port>::parks;
  using shard_setup<Port>::park;
  using shard_setup<Port>::cfg_;
  using shard_setup<Port>::who_;
  using shard_setup<Port>::slices_;
  using shard_setup<Port>::left_;
  using shard_setup<Port>::dead_;
  using shard_setup<Port>::held_;
  using shard_setup<Port>::deferred_;

  // The rules of versions and bounded staleness (server/pull_gate.hpp).
  pull_gate gate() const noexcept { return {cfg_, left_, dead_}; }
  bool may_answer(int rank, const slice& s, std::uint64_t min_version) const {
    return gate().may_answer(rank, s, min_version);
  }

  void hold(held_pull<Port> p) {
    p.deadline = std::chrono::steady_clock::now() + cfg_.hold_timeout;
    const std::string what = "a pull of key " + key_str(p.h.key);
    held_.hold(std::move(p), {cfg_.max_held_pulls, cfg_.max_held_bytes}, who_, what);
  }

  void answer_held(const held_pull<Port>& p, const slice& s) {
    if (p.h.command == wire::cmd::pull_rows)
      answers::send_rows(p.port, p.h, s, p.rows, cfg_.chunk_bytes);
    else if (p.h.flags & wire::flag_range)
      answers::send_range(p.port, p.h, s, {p.range_offset, p.range_length}, cfg_.chunk_bytes);
    else
      answers::send_value(p.port, p.h, s, cfg_.chunk_bytes);
  }

  // Answers the held pulls of `s` that may be answered now.
  void release_held(const slice& s) {
    if (held_.empty()) return;
    if (deferred_.active()) return deferred_.held(s.key);
    for (auto& p : held_.take_ready(
             s.key, [&](const held_pull<Port>& q) { return may_answer(q.rank, s, q.h.aux); }))
      answer_held(p, s);
  }

  void release_all_held() {
    for (auto k : held_.keys())
      if (slice* s = slices_.find_value(k)) release_held(*s);
  }

  // A worker died without leaving the group: in dist_sync no round completes any more, so a
  // pull waiting for a version fails now; in dist_async the dead worker holds no one back.
  void held_after_death(const std::string& why) {
    if (!cfg_.sync) return release_all_held();
    for (auto& p : held_.take_all())
      p.port.reply(p.h.req_id, errc::node_dead, why_held(p) + ", which cannot come: " + why);
  }

  // What a held pull waits for, for its error.
  std::string why_held(const held_pull<Port>& p) const {
    return gate().why_waits(p.rank, p.h.key, p.h.aux, slices_.find_value(p.h.key), who_);
  }
};

}  // namespace kvstore::detail
