// Which element ranges of a key slice a sync round has written so far, merged: the first push to
// reach a range copies into the round's merge buffer, later ones add to it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <utility>

namespace kvstore::detail {

/// Element ranges [begin, end) written so far in a sync round (relative to the slice), merged.
/// Nearly every round writes one range (a whole value, or frames that follow each other): that
/// one is held inline, so a round allocates nothing; a second range apart from it moves both to
/// a map.
class coverage {
 public:
  /// Calls copy(b, e) for the parts of [a, b) not yet written, add(b, e) for the parts already
  /// written, in increasing order, then marks [a, b) written.
  template <class Copy, class Add>
  void contribute(std::uint64_t a, std::uint64_t b, Copy&& copy, Add&& add) {
    if (!spilled_) {
      if (!has_one_) {
        if (a < b) copy(a, b);
        one_ = {a, b};
        has_one_ = true;
        return;
      }
      if (a <= one_.second && b >= one_.first) {  // touches or overlaps the one range
        const std::uint64_t lo = std::max(a, one_.first), hi = std::min(b, one_.second);
        if (a < one_.first) copy(a, one_.first);
        if (lo < hi) add(lo, hi);
        if (b > one_.second) copy(std::max(a, one_.second), b);
        one_ = {std::min(a, one_.first), std::max(b, one_.second)};
        return;
      }
      if (a >= b) return;  // an empty range apart from the one range marks nothing
      spilled_ = std::make_unique<ranges>();
      if (one_.first < one_.second) spilled_->emplace(one_.first, one_.second);
      has_one_ = false;
    }
    contribute_spilled(a, b, copy, add);
  }

  /// Marks [0, n) written in a round that wrote nothing yet (empty()): contribute(0, n, ...)
  /// after its copy, for a caller that copied the whole value itself.
  void mark_whole(std::uint64_t n) noexcept {
    one_ = {0, n};
    has_one_ = true;
  }

  /// True when no written range overlaps [a, b).
  bool disjoint(std::uint64_t a, std::uint64_t b) const {
    if (!spilled_) return !has_one_ || b <= one_.first || a >= one_.second;
    auto it = spilled_->upper_bound(a);
    if (it != spilled_->begin() && std::prev(it)->second > a) return false;
    return it == spilled_->end() || it->first >= b;
  }

  /// Calls f(b, e) for each written range, in increasing order.
  template <class F>
  void for_each(F&& f) const {
    if (has_one_) return f(one_.first, one_.second);
    if (spilled_)
      for (auto [b, e] : *spilled_) f(b, e);
  }
  /// True when the round wrote exactly [0, n).
  bool whole(std::uint64_t n) const noexcept {
    return has_one_ && one_.first == 0 && one_.second == n;
  }
  void clear() noexcept {
    has_one_ = false;
    spilled_.reset();
  }
  bool empty() const noexcept { return !has_one_ && !spilled_; }

 private:
  template <class Copy, class Add>
  void contribute_spilled(std::uint64_t a, std::uint64_t b, Copy& copy, Add& add) {
    // An empty range marks nothing. Kept, it would split a later range around it into an
    // empty add() between two copies.
    if (a >= b) return;
    ranges& m = *spilled_;
    std::uint64_t pos = a;
    auto it = m.upper_bound(a);
    if (it != m.begin()) --it;
    while (pos < b) {
      while (it != m.end() && it->second <= pos) ++it;
      if (it == m.end() || it->first >= b) {
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
    auto j = m.upper_bound(a);
    if (j != m.begin()) {
      auto p = std::prev(j);
      if (p->second >= a) {
        na = p->first;
        nb = std::max(nb, p->second);
        j = p;
      }
    }
    while (j != m.end() && j->first <= nb) {
      nb = std::max(nb, j->second);
      j = m.erase(j);
    }
    m[na] = nb;
  }

  using ranges = std::map<std::uint64_t, std::uint64_t>;

  // All the ranges when there are several, else null; never empty, as a spill always adds a
  // range. Apart, as that is rare, so a slice's coverage fits beside its other hot fields
  // (server/slice.hpp). First, with has_one_: empty() reads both.
  std::unique_ptr<ranges> spilled_;
  bool has_one_ = false;
  std::pair<std::uint64_t, std::uint64_t> one_{0, 0};  // the only range, while has_one_
};

}  // namespace kvstore::detail
