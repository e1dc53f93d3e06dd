// Per-worker bookkeeping of a shard, flat: a set of worker ranks as a bitmap, and a number per
// rank in a vector indexed by rank. Every key slice keeps several of them and touches them on
// every push, so they allocate nothing per entry (a std::set or std::map allocates a node per
// insert, once per key per round). Ranks are those of the job's workers: small, never negative.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>

namespace kvstore::detail {

/// The words past a rank set's or rank numbers' inline ones (ranks beyond the first few): one
/// block on the heap, allocated when such a rank is first set, its length in its first word, and
/// held by one pointer. A std::vector's three words in each of a slice's rank fields made a sync
/// round's fields span five cache lines of the slice, not four (server/slice.hpp), and a push is
/// bound by the lines it reads; one block, not a vector behind a pointer, keeps a high rank's
/// number one dependent load from the slice, as it was.
class spilled_words {
 public:
  spilled_words() = default;
  spilled_words(const spilled_words& o) : b_(copy(o.b_.get())) {}
  spilled_words(spilled_words&&) noexcept = default;
  spilled_words& operator=(const spilled_words& o) {
    if (this != &o) b_ = copy(o.b_.get());
    return *this;
  }
  spilled_words& operator=(spilled_words&&) noexcept = default;
  ~spilled_words() = default;

  std::size_t size() const noexcept { return b_ ? static_cast<std::size_t>(b_[0]) : 0; }
  std::uint64_t operator[](std::size_t i) const noexcept { return b_[i + 1]; }
  std::uint64_t& operator[](std::size_t i) noexcept { return b_[i + 1]; }
  /// At least n words, the new ones 0.
  void grow(std::size_t n) {
    const std::size_t had = size();
    if (had >= n) return;
    auto b = std::make_unique<std::uint64_t[]>(n + 1);  // zeroed
    b[0] = n;
    if (had) std::copy(begin(), end(), b.get() + 1);
    b_ = std::move(b);
  }
  /// Every word 0 (the words kept, for the next round).
  void zero() noexcept {
    if (b_) std::fill(b_.get() + 1, b_.get() + 1 + size(), 0);
  }
  const std::uint64_t* begin() const noexcept { return b_ ? b_.get() + 1 : nullptr; }
  const std::uint64_t* end() const noexcept { return b_ ? b_.get() + 1 + size() : nullptr; }

 private:
  static std::unique_ptr<std::uint64_t[]> copy(const std::uint64_t* from) {
    if (!from) return nullptr;
    const auto n = static_cast<std::size_t>(from[0]) + 1;
    auto b = std::make_unique_for_overwrite<std::uint64_t[]>(n);
    std::copy(from, from + n, b.get());
    return b;
  }
  std::unique_ptr<std::uint64_t[]> b_;  // b_[0]: how many words follow
};

/// A set of worker ranks: one word for ranks 0-63, a word more per 64 beyond.
class rank_set {
 public:
  /// 1 when `r` is in the set, else 0 (as std::set::count). (Ranks 0-63 in a line or two:
  /// the check runs on every push of every key and must inline wherever it is called.)
  std::size_t count(int r) const noexcept {
    if (static_cast<unsigned>(r) < 64) return (low_ >> static_cast<unsigned>(r)) & 1u;
    return count_high(r);
  }
  /// Whether every rank below n is in this set or in `also`: a word at a time, where a rank at a
  /// time made a sync round's check grow with the workers on every push of every key.
  bool covers(int n, const rank_set& also) const noexcept {
    for (std::size_t w = 0; n > 0; ++w, n -= 64) {
      const std::uint64_t want = n >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
      if (((word(w) | also.word(w)) & want) != want) return false;
    }
    return true;
  }
  /// Adds `r` (not negative); true when it was not in the set.
  bool insert(int r) {
    const auto w = static_cast<std::size_t>(r) / 64;
    std::uint64_t* word = &low_;
    if (w) {
      high_.grow(w);
      word = &high_[w - 1];
    }
    const std::uint64_t bit = std::uint64_t{1} << (static_cast<unsigned>(r) % 64);
    const bool fresh = !(*word & bit);
    *word |= bit;
    return fresh;
  }
  void clear() noexcept {
    low_ = 0;
    high_.zero();
  }
  bool empty() const noexcept {
    return low_ == 0 && std::all_of(high_.begin(), high_.end(), [](auto w) { return w == 0; });
  }
  std::size_t size() const noexcept {
    std::size_t n = static_cast<std::size_t>(std::popcount(low_));
    for (auto w : high_) n += static_cast<std::size_t>(std::popcount(w));
    return n;
  }
  /// Calls f(rank) for each rank in the set, in increasing order.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t w = 0; w <= high_.size(); ++w)
      for (std::uint64_t bits = word(w); bits; bits &= bits - 1)
        f(static_cast<int>(w * 64 + static_cast<std::size_t>(std::countr_zero(bits))));
  }

 private:
  std::size_t count_high(int r) const noexcept {
    if (r < 0) return 0;
    return (word(static_cast<std::size_t>(r) / 64) >> (static_cast<unsigned>(r) % 64)) & 1u;
  }
  std::uint64_t word(std::size_t w) const noexcept {
    return w == 0 ? low_ : w - 1 < high_.size() ? high_[w - 1] : 0;
  }

  std::uint64_t low_ = 0;
  spilled_words high_;  // ranks 64 and up
};

/// A number per worker rank; 0 is "none". The first ranks' numbers live in the object itself (a
/// push of one worker reads and sets its rank's number for every key it names: over many keys a
/// number on the heap was one more cache miss per key); spilled words hold the rest, grown to
/// the highest rank set, and kept when cleared.
class rank_values {
 public:
  // (get and set: the inline ranks in a line or two, the rest out of line, so that both inline
  // on a push's path of every key; callgrind counted 30 instructions a key when they did not.)
  std::uint64_t get(int r) const noexcept {
    if (static_cast<unsigned>(r) < inline_ranks) return low_[static_cast<unsigned>(r)];
    return get_high(r);
  }
  /// Sets rank `r`'s number (r not negative).
  void set(int r, std::uint64_t x) {
    if (static_cast<unsigned>(r) < inline_ranks) {
      low_[static_cast<unsigned>(r)] = x;
      return;
    }
    set_high(static_cast<std::size_t>(r), x);
  }
  void clear() noexcept {
    std::fill(std::begin(low_), std::end(low_), 0);
    high_.zero();
  }
  /// Calls f(rank, number) for each rank with a number, in increasing order.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < inline_ranks; ++i)
      if (low_[i]) f(static_cast<int>(i), low_[i]);
    for (std::size_t j = 0; j < high_.size(); ++j)
      if (high_[j]) f(static_cast<int>(j + inline_ranks), high_[j]);
  }

 private:
  std::uint64_t get_high(int r) const noexcept {
    if (r < 0) return 0;
    const auto j = static_cast<std::size_t>(r) - inline_ranks;
    return j < high_.size() ? high_[j] : 0;
  }
  void set_high(std::size_t i, std::uint64_t x) {
    const std::size_t j = i - inline_ranks;
    if (j >= high_.size()) {
      if (x == 0) return;
      high_.grow(j + 1);
    }
    high_[j] = x;
  }

  static constexpr std::size_t inline_ranks = 2;
  std::uint64_t low_[inline_ranks] = {};
  spilled_words high_;  // ranks inline_ranks and up
};

}  // namespace kvstore::detail
