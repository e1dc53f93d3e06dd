// One server's shard of the model: for each key the slice [lo, hi) of its elements this server
// owns, the value, the optimizer state, and the sync round being gathered. No networking here:
// the server feeds it decoded requests and it says what to answer.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/server/checkpoint.hpp>
#include <kvstore/wire/frame.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace kvstore::detail {

/// Calls f.template operator()<T>() with T the element type of `t`.
template <class F>
decltype(auto) with_dtype(wire::dtype t, F&& f) {
  if (t == wire::dtype::f64) return f.template operator()<double>();
  return f.template operator()<float>();
}

using bytes = std::vector<std::byte>;

/// Element ranges [begin, end) written so far in a sync round (relative to the slice), merged.
class coverage {
 public:
  /// Calls copy(b, e) for the parts of [a, b) not yet written, add(b, e) for the parts already
  /// written, then marks [a, b) written.
  template <class Copy, class Add>
  void contribute(std::uint64_t a, std::uint64_t b, Copy&& copy, Add&& add) {
    std::uint64_t pos = a;
    auto it = ranges_.upper_bound(a);
    if (it != ranges_.begin()) --it;
    while (pos < b) {
      while (it != ranges_.end() && it->second <= pos) ++it;
      if (it == ranges_.end() || it->first >= b) {
        copy(pos, b);
        break;
      }
      if (it->first > pos) {
        copy(pos, it->first);
        pos = it->first;
      }
      const std::uint64_t e = std::min(b, it->second);
      add(pos, e);
      pos = e;
    }
    std::uint64_t na = a, nb = b;
    auto j = ranges_.upper_bound(a);
    if (j != ranges_.begin()) {
      auto p = std::prev(j);
      if (p->second >= a) {
        na = p->first;
        nb = std::max(nb, p->second);
        j = p;
      }
    }
    while (j != ranges_.end() && j->first <= nb) {
      nb = std::max(nb, j->second);
      j = ranges_.erase(j);
    }
    ranges_[na] = nb;
  }
  /// True when no written range overlaps [a, b).
  bool disjoint(std::uint64_t a, std::uint64_t b) const {
    auto it = ranges_.upper_bound(a);
    if (it != ranges_.begin() && std::prev(it)->second > a) return false;
    return it == ranges_.end() || it->first >= b;
  }
  const std::map<std::uint64_t, std::uint64_t>& ranges() const noexcept { return ranges_; }
  void clear() noexcept { ranges_.clear(); }
  bool empty() const noexcept { return ranges_.empty(); }

 private:
  std::map<std::uint64_t, std::uint64_t> ranges_;
};

/// Where an answer goes: the asking connection (it may be gone) and its request id.
template <class Conn>
struct reply_to {
  std::weak_ptr<Conn> conn;
  std::uint64_t req_id = 0;
};

/// One key's slice on this server.
template <class Conn>
struct key_slice : slice_header {
  std::shared_ptr<bytes> value;  // shared with pull answers in flight: copy on write
  bool inited = false;
  bool restored = false;  // loaded from a snapshot: re-sent inits are acknowledged
  std::set<int> init_done;  // workers whose init arrived
  std::vector<reply_to<Conn>> init_waiters;

  // The sync round being gathered.
  bytes merge;
  coverage cov;
  std::set<int> round_done;
  std::vector<reply_to<Conn>> round_waiters;
  // Exactly-once pushes across a server restart: per worker, the sequence number of its last
  // push applied (kept in snapshots), and of its push in the round being gathered.
  std::map<int, std::uint64_t> applied;
  std::map<int, std::uint64_t> round_seq;
  // dist_async applies a push sent in several frames frame by frame. Per worker, the push in
  // progress: its sequence number, how many of its frames were applied (kept in snapshots) and
  // how many arrived on the worker's current connection. After a restart from a snapshot taken
  // mid-push, the re-sent push's first `applied` frames are skipped: exactly once, frame by frame.
  struct part {
    std::uint64_t seq = 0, applied = 0, received = 0;
  };
  std::map<int, part> parts;

  /// Whether to apply this frame (`last`: flagged last) of worker `rank`'s async push `seq` (0:
  /// not numbered, always applied), and whether it is the push's first frame applied (one
  /// optimizer step per push). A push of one frame is applied at once, nothing tracked.
  bool take_async_frame(int rank, std::uint64_t seq, bool last, bool& first) {
    first = true;
    if (seq == 0) return true;
    auto it = parts.find(rank);
    if (it == parts.end()) {
      if (last) return true;
      it = parts.emplace(rank, part{}).first;
    }
    auto& p = it->second;
    if (p.seq != seq) p = part{seq, 0, 0};
    if (++p.received <= p.applied) return false;  // re-sent: applied before the restart
    first = p.applied++ == 0;
    return true;
  }

  /// A re-sent push this slice already applied (sequence 0: not numbered, never a duplicate).
  bool duplicate(int rank, std::uint64_t seq) const {
    if (seq == 0) return false;
    auto it = applied.find(rank);
    return it != applied.end() && it->second >= seq;
  }

  optim::state<float> st_f;
  optim::state<double> st_d;

  std::size_t elem() const { return wire::dtype_size(type); }
  std::uint64_t size() const { return hi - lo; }

  /// The value, copied first if a pull answer still reads the current one.
  bytes& mutable_value() {
    if (value.use_count() > 1) value = std::make_shared<bytes>(*value);
    return *value;
  }
};

}  // namespace kvstore::detail
