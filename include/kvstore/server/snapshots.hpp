// When and what a server snapshots: the shard (server/shard.hpp) to a wire::shard_snapshot and
// back, and the policy (after every init and optimizer change, every `rounds` completed rounds
// or async pushes, every `interval` while something changed, on a worker's checkpoint()). The
// file is server/checkpoint.hpp's, its bytes wire/snapshot.hpp's.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/server/checkpoint.hpp>
#include <kvstore/server/shard.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

namespace kvstore::detail {

/// The shard as saved.
template <class Port>
shard_snapshot take_snapshot(const shard<Port>& sh, int rank) {
  shard_snapshot snap;
  snap.rank = rank;
  snap.optimizer_name = sh.optimizer_name();
  snap.optimizer_params = sh.optimizer_params();
  for (auto& entry : sh.slices()) {
    // Named, not a structured binding: clang 14 cannot capture those in the lambda below.
    const auto& sl = entry.second;
    if (!sl.inited) continue;
    slice_snapshot x;
    static_cast<slice_header&>(x) = sl;
    sl.applied.for_each([&](int r, std::uint64_t last) { x.applied.emplace_back(r, last); });
    for (auto& [r, p] : sl.parts) x.parts.push_back({r, p.seq, p.applied});
    x.lr_mult = sl.mult.lr;
    x.wd_mult = sl.mult.wd;
    x.value.assign(reinterpret_cast<const char*>(sl.value.data()), sl.value.size());
    with_dtype(sl.type, [&]<class T>() {
      const auto& st = sl.template state<T>();
      x.step = st.step;
      for (auto& v : st.slots)
        x.slots.emplace_back(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    });
    snap.slices.push_back(std::move(x));
  }
  return snap;
}

/// A dist_async slice's version (pushes applied) from a snapshot written before async slices
/// counted it in `round`: the sum of each worker's last push number, the count of its pushes
/// (numbered 1, 2, ... per key) that the slice applied.
inline std::uint64_t async_version_of(const slice_snapshot& x) {
  std::uint64_t n = 0;
  for (auto [rank, last] : x.applied) n += last;
  return n;
}

/// Replaces the shard's slices and optimizer by `snap`'s. Every slice counts as inited by all
/// `num_workers` workers: re-sent inits are answered, pushes re-sent after the restart that the
/// snapshot holds are acknowledged, not applied twice. Throws (changing nothing) for an unknown
/// optimizer.
template <class Port>
void restore_snapshot(shard<Port>& sh, const shard_snapshot& snap, int num_workers) {
  typename shard<Port>::slice_map restored;
  for (auto& x : snap.slices) {
    auto& sl = restored[x.key];
    static_cast<slice_header&>(sl) = x;
    // Ranks of this job only: a snapshot of a larger job names workers that cannot push here.
    for (auto [r, last] : x.applied)
      if (r >= 0 && r < num_workers && !sl.applied.get(r)) sl.applied.set(r, last);
    if (!sh.config().sync && sl.round == 0) sl.round = async_version_of(x);
    for (auto& p : x.parts) sl.parts[p.rank] = {p.seq, p.frames, 0};
    sl.mult = {x.lr_mult, x.wd_mult};
    sl.inited = true;
    sl.restored = true;
    for (int r = 0; r < num_workers; ++r) sl.init_done.insert(r);
    auto* p = reinterpret_cast<const std::byte*>(x.value.data());
    sl.value = slice_value(p, x.value.size());
    with_dtype(x.type, [&]<class T>() {
      auto& st = sl.template state<T>();
      st.step = x.step;
      for (auto& raw : x.slots) {
        std::vector<T> v(raw.size() / sizeof(T));
        std::memcpy(v.data(), raw.data(), raw.size());
        st.slots.push_back(std::move(v));
      }
    });
  }
  sh.adopt(std::move(restored), snap.optimizer_name, snap.optimizer_params);
}

/// One server's snapshots: restores at start, saves when the policy says so.
template <class Port>
class snapshots {
 public:
  struct policy {
    std::filesystem::path dir;  ///< empty: no snapshots
    std::chrono::milliseconds interval{0};
    std::uint64_t rounds = 0;
  };

  snapshots(shard<Port>& sh, policy p) : shard_(sh), policy_(std::move(p)) {}

  /// Who saves: the rank names the file, `who` the messages.
  void identify(int rank, std::string who) {
    rank_ = rank;
    who_ = std::move(who);
  }

  /// Loads server `rank`'s snapshot into the shard, if there is one: a restarted server serves
  /// exactly what it saved. A corrupt snapshot throws (never half-loaded).
  void restore(int rank, int num_workers) {
    if (policy_.dir.empty() || rank < 0) return;
    const auto path = snapshot_path(policy_.dir, rank);
    if (!std::filesystem::exists(path)) return;
    restore_snapshot(shard_, load_snapshot(path), num_workers);
    log_warn("server " + std::to_string(rank), "restored " +
                                                   std::to_string(shard_.slices().size()) +
                                                   " key slice(s) from " + path.string());
  }

  /// Writes the shard's snapshot (atomically). Throws kvstore::error on I/O failure or when
  /// there is no checkpoint directory.
  void save() {
    if (policy_.dir.empty())
      throw error(errc::unsupported,
                  who_ + " has no checkpoint directory (KVSTORE_CHECKPOINT_DIR)");
    auto snap = take_snapshot(shard_, rank_);
    std::filesystem::create_directories(policy_.dir);
    save_snapshot(snapshot_path(policy_.dir, rank_), snap);
    dirty_ = false;
    changes_ = 0;
    last_ = std::chrono::steady_clock::now();
  }

  /// The shard changed (`changes` keys' rounds or pushes): saves now if the count says so, or
  /// at once when `important`.
  void changed(bool important, std::uint64_t changes = 1) {
    dirty_ = true;
    changes_ += changes;
    if (policy_.dir.empty()) return;
    if (important || (policy_.rounds && changes_ >= policy_.rounds)) save_quietly();
  }

  /// Called now and then: saves when the interval has passed since the last save and
  /// something changed.
  void tick() {
    if (policy_.interval.count() > 0 && dirty_ &&
        std::chrono::steady_clock::now() - last_ >= policy_.interval)
      save_quietly();
  }

 private:
  void save_quietly() {
    try {
      save();
    } catch (const std::exception& e) {
      log_warn(who_, std::string("snapshot failed: ") + e.what());
    }
  }

  shard<Port>& shard_;
  policy policy_;
  int rank_ = -1;
  std::string who_ = "server";
  bool dirty_ = false;
  std::uint64_t changes_ = 0;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace kvstore::detail
