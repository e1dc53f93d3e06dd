// When a pull may be answered: once its slice reached the version it asked for (a sync round
// number) and, in dist_async with a staleness bound, once no worker still in the group is too
// many pushes of the key behind the one that asks. The shard holds the pulls that may not be
// answered yet (server/held_pulls.hpp); this says which may go, and what a held one waits for.
#pragma once

#include <kvstore/server/ranks.hpp>
#include <kvstore/server/shard_config.hpp>
#include <kvstore/server/slice.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace kvstore::detail {

/// The rules of versions and bounded staleness over a shard's configuration and membership
/// (both referred to, not copied: make one when asking).
class pull_gate {
 public:
  pull_gate(const shard_config& cfg, const rank_set& left, const rank_set& dead) noexcept
      : cfg_(cfg), left_(left), dead_(dead) {}

  /// How many pushes of the slice's key worker `rank` had applied here: its last push number
  /// (workers number their pushes of a key 1, 2, ... and send each to every slice of the key,
  /// and a re-sent push is never applied twice, so this is a count that survives a restart).
  template <class Slice>
  static std::uint64_t pushes_of(const Slice& s, int rank) {
    return s.applied.get(rank);
  }

  /// Whether a pull may have to wait for a slower worker: only under a staleness bound (else a
  /// pull that asks for no version is answered at once).
  bool may_lag() const noexcept { return !cfg_.sync && cfg_.staleness; }

  /// A worker of the group (not left, not dead) that worker `rank` is more than staleness
  /// pushes of this slice ahead of, if any. Only dist_async has a bound: in dist_sync a push is
  /// answered once every worker's push of its round is in, so no worker is ever ahead.
  template <class Slice>
  std::optional<int> laggard(int rank, const Slice& s) const {
    if (!may_lag()) return std::nullopt;  // inline: every pull of a key asks
    const std::uint64_t own = pushes_of(s, rank);
    if (own <= *cfg_.staleness) return std::nullopt;
    for (int r = 0; r < cfg_.num_workers; ++r)
      if (r != rank && !left_.count(r) && !dead_.count(r) &&
          pushes_of(s, r) < own - *cfg_.staleness)
        return r;
    return std::nullopt;
  }

  /// Whether worker `rank`'s pull of `s` asking for version `min_version` may be answered now.
  template <class Slice>
  bool may_answer(int rank, const Slice& s, std::uint64_t min_version) const {
    return s.round >= min_version && !laggard(rank, s);
  }

  /// What worker `rank`'s pull of `key` asking for `min_version` waits for, for its error; `s`:
  /// the key's slice on this server `who`, or nullptr when there is none (any more).
  template <class Slice>
  std::string why_waits(int rank, std::uint64_t key, std::uint64_t min_version, const Slice* s,
                        const std::string& who) const {
    const std::string k = "key " + key_str(key);
    if (!s) return k + " waited";
    if (s->round < min_version)
      return k + " waited for version " + std::to_string(min_version) + " (its slice on " + who +
             " is at version " + std::to_string(s->round) + ")";
    const auto slow = laggard(rank, *s);
    if (!slow) return k + " waited";
    return k + " waited for worker " + std::to_string(*slow) + ", which pushed it " +
           std::to_string(pushes_of(*s, *slow)) + " times, more than staleness " +
           std::to_string(*cfg_.staleness) + " behind worker " + std::to_string(rank) + "'s " +
           std::to_string(pushes_of(*s, rank));
  }

 private:
  const shard_config& cfg_;
  const rank_set& left_;
  const rank_set& dead_;
};

}  // namespace kvstore::detail
