// Which element ranges of a key slice a sync round has written so far, merged: the first push to
// reach a range copies into the round's merge buffer, later ones add to it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace kvstore::detail {

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

}  // namespace kvstore::detail
