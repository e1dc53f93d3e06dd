// The pulls a server holds until it may answer them: a pull asking for a version its key's slice
// has not reached (pull_options::min_version), or, in dist_async with bounded staleness, a pull
// of a worker too far ahead of a slower one. Plain bookkeeping, bounded per worker (a count and
// the bytes of the row lists kept), so a peer asking for far-future versions cannot grow the
// server; each one expires at its deadline. The shard (server/shard.hpp) decides when one is
// ready and answers it.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/wire/frame.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// One held pull: where its answer goes, who asked, the request, and when it gives up.
template <class Port>
struct held_pull {
  Port port;
  int rank = -1;
  wire::header h;                  ///< the pull or pull_rows request (h.aux: the min version)
  std::vector<std::int64_t> rows;  ///< pull_rows: the rows asked, checked already
  std::chrono::steady_clock::time_point deadline;
  std::uint64_t range_offset = 0, range_length = 0;  ///< a range pull's elements, checked already

  std::uint64_t bytes() const noexcept { return sizeof(held_pull) + rows.size() * sizeof(rows[0]); }
};

template <class Port>
class held_pulls {
 public:
  using clock = std::chrono::steady_clock;
  using pull = held_pull<Port>;

  /// How much one worker may have held at once.
  struct limits {
    std::size_t max_pulls = 4096;
    std::uint64_t max_bytes = std::uint64_t{64} << 20;
  };

  /// Holds `p`. Throws invalid_argument, holding nothing, when its worker is at a limit; `who`
  /// names the server and `what` the pull in the message.
  void hold(pull p, const limits& lim, const std::string& who, const std::string& what) {
    auto& use = use_[p.rank];
    if (use.pulls >= lim.max_pulls || p.bytes() > lim.max_bytes ||
        use.bytes > lim.max_bytes - p.bytes())
      throw error(
          errc::invalid_argument,
          who + " already holds " + std::to_string(use.pulls) + " pulls (" +
              std::to_string(use.bytes) + " bytes) of worker " + std::to_string(p.rank) +
              " waiting for a version or slower workers, its limit (KVSTORE_MAX_HELD_PULLS " +
              std::to_string(lim.max_pulls) + ", " + std::to_string(lim.max_bytes) +
              " bytes): refused " + what);
    ++use.pulls;
    use.bytes += p.bytes();
    const std::uint64_t id = next_++;
    by_key_[p.h.key].insert(id);
    all_.emplace(id, std::move(p));
  }

  bool empty() const noexcept { return all_.empty(); }
  std::size_t size() const noexcept { return all_.size(); }
  /// How many pulls of worker `rank` are held.
  std::size_t count(int rank) const {
    auto it = use_.find(rank);
    return it == use_.end() ? 0 : it->second.pulls;
  }

  /// Takes the held pulls of `key` for which ready(pull) is true, in arrival order.
  template <class Ready>
  std::vector<pull> take_ready(std::uint64_t key, Ready&& ready) {
    std::vector<pull> out;
    auto k = by_key_.find(key);
    if (k == by_key_.end()) return out;
    for (auto it = k->second.begin(); it != k->second.end();) {
      auto p = all_.find(*it);
      if (!ready(std::as_const(p->second))) {
        ++it;
        continue;
      }
      out.push_back(release(p));
      it = k->second.erase(it);
    }
    if (k->second.empty()) by_key_.erase(k);
    return out;
  }

  /// The keys that have held pulls (to look at again after a membership change).
  std::vector<std::uint64_t> keys() const {
    std::vector<std::uint64_t> out;
    out.reserve(by_key_.size());
    for (auto& entry : by_key_) out.push_back(entry.first);
    return out;
  }

  /// Takes the pulls whose deadline is at or before `now`.
  std::vector<pull> take_expired(clock::time_point now) {
    return take_if([now](const pull& p) { return p.deadline <= now; });
  }

  /// Takes every pull of worker `rank` (its connection is gone: no answer can reach it).
  std::vector<pull> take_worker(int rank) {
    if (!count(rank)) return {};
    return take_if([rank](const pull& p) { return p.rank == rank; });
  }

  /// Takes them all.
  std::vector<pull> take_all() {
    return take_if([](const pull&) { return true; });
  }

  /// The earliest deadline of a held pull, if any.
  std::optional<clock::time_point> next_deadline() const {
    std::optional<clock::time_point> next;
    for (auto& entry : all_)
      if (!next || entry.second.deadline < *next) next = entry.second.deadline;
    return next;
  }

 private:
  struct usage {
    std::size_t pulls = 0;
    std::uint64_t bytes = 0;
  };

  // Removes `it` from all_ and its worker's usage (not from by_key_: the caller does).
  pull release(typename std::map<std::uint64_t, pull>::iterator it) {
    pull p = std::move(it->second);
    auto u = use_.find(p.rank);
    --u->second.pulls;
    u->second.bytes -= p.bytes();
    if (!u->second.pulls) use_.erase(u);
    all_.erase(it);
    return p;
  }

  template <class Pred>
  std::vector<pull> take_if(Pred&& pred) {
    std::vector<pull> out;
    for (auto it = all_.begin(); it != all_.end();) {
      if (!pred(std::as_const(it->second))) {
        ++it;
        continue;
      }
      const std::uint64_t id = it->first, key = it->second.h.key;
      auto next = std::next(it);
      out.push_back(release(it));
      auto k = by_key_.find(key);
      k->second.erase(id);
      if (k->second.empty()) by_key_.erase(k);
      it = next;
    }
    return out;
  }

  std::map<std::uint64_t, pull> all_;  // by arrival
  std::unordered_map<std::uint64_t, std::set<std::uint64_t>> by_key_;
  std::unordered_map<int, usage> use_;
  std::uint64_t next_ = 0;
};

}  // namespace kvstore::detail
