// What a shard holds back while it serves a batched frame (server/batch.hpp): the answers, the
// count of changes, and the keys whose held pulls may be answered. At the frame's end the changes
// are reported once (one snapshot for the frame, taken before anything it did is answered), then
// the answers go out, ok answers of flag_each keys (fused pushes) gathered per peer into runs of
// consecutive request ids, then the held pulls are looked at. Plain bookkeeping: the shard
// (server/shard.hpp) decides what is deferred and what reporting and releasing mean.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/server/slice.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::detail {

template <class Port>
class deferred_answers {
 public:
  /// Whether a batched frame is being served: what it changes or answers waits for end().
  bool active() const noexcept { return active_; }
  void begin() noexcept { active_ = true; }

  /// `n` changes (`important`: an init or optimizer change), reported at end().
  void change(bool important, std::uint64_t n = 1) noexcept {
    changes_ += n;
    important_ = important_ || important;
  }
  /// A response to `to` (never a batched request's countdown: that answers through here).
  void answer(reply_to<Port> to, errc status, std::string message) {
    answers_.push_back({std::move(to), status, std::move(message)});
  }
  /// The held pulls of `key` may be answered at end().
  void held(std::uint64_t key) { held_.push_back(key); }

  /// The frame is served: `report(important, changes)` if anything changed, then the answers,
  /// then `release(key)` for each key passed to held(), in order. No longer active by then, so
  /// what `release` answers goes out at once.
  template <class Report, class Release>
  void end(Report&& report, Release&& release) {
    active_ = false;
    if (changes_ || important_) report(important_, changes_);
    changes_ = 0;
    important_ = false;
    send_answers();
    for (auto k : held_) release(k);
    held_.clear();
  }

 private:
  // Ok answers of flag_each keys are gathered per peer into runs of consecutive request ids,
  // each sent as one response (flag_each, aux: how many) after the others; a round that
  // completes for several workers answers them key by key, interleaved, so runs are kept per
  // peer, not by position.
  void send_answers() {
    struct run {
      Port port;
      std::uint64_t first, n;
    };
    std::vector<run> runs;
    std::vector<std::size_t> latest;  // per peer seen, the index of its latest run
    for (auto& x : answers_) {
      if (!x.to.each || x.status != errc::ok) {
        x.to.port.reply(x.to.req_id, x.status, std::move(x.message));
        continue;
      }
      std::size_t* peer = nullptr;
      for (auto& l : latest)
        if (runs[l].port.same_peer(x.to.port)) peer = &l;
      if (peer && runs[*peer].first + runs[*peer].n == x.to.req_id) {
        ++runs[*peer].n;
        continue;
      }
      runs.push_back({x.to.port, x.to.req_id, 1});
      if (peer)
        *peer = runs.size() - 1;
      else
        latest.push_back(runs.size() - 1);
    }
    answers_.clear();
    for (auto& r : runs) send_acks(r.port, r.first, r.n);
  }

  struct answer_t {
    reply_to<Port> to;
    errc status;
    std::string message;
  };
  bool active_ = false;
  std::uint64_t changes_ = 0;
  bool important_ = false;
  std::vector<answer_t> answers_;
  std::vector<std::uint64_t> held_;  // keys whose held pulls may be answered
};

}  // namespace kvstore::detail
