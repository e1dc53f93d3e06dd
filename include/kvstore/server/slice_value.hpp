// A slice's value on a server, and its sync round's sum: a few bytes kept inside the slice, or a
// buffer of its own (a value's is shared with the pull answers that still send it: copy on
// write). Models of many small tensors (biases, scalars, single-float keys) then cost a batched
// push no load past the slice's own lines: a buffer of its own took two dependent misses a key
// (its shared block, then its bytes) and two allocations at init (issue 12).
#pragma once

#include <kvstore/detail/prefetch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace kvstore::detail {

using bytes = std::vector<std::byte>;

class slice_value {
 public:
  /// Values of at most this many bytes live inside the slice (four floats, two doubles).
  static constexpr std::size_t inline_bytes = 16;
  /// Whether a value of `n` bytes lives inside the slice.
  static constexpr bool fits_inline(std::size_t n) noexcept { return n <= inline_bytes; }
  /// What a buffer of its own costs beyond its bytes: the shared block (a vtable pointer, two
  /// counts) with its vector, and two allocations' headers (malloc's: two words each).
  static constexpr std::size_t own_buffer_bytes =
      3 * sizeof(void*) + sizeof(bytes) + 2 * 2 * sizeof(std::size_t);

  slice_value() noexcept { std::memset(small_, 0, inline_bytes); }
  /// n zero bytes.
  explicit slice_value(std::size_t n) : size_(n) {
    if (is_inline())
      std::memset(small_, 0, inline_bytes);
    else
      new (&large_) std::shared_ptr<bytes>(std::make_shared<bytes>(n));
  }
  /// A copy of the n bytes at p.
  slice_value(const std::byte* p, std::size_t n) : slice_value(n) {
    if (n) std::memcpy(data(), p, n);
  }
  slice_value(const slice_value& o) : size_(o.size_) {
    if (is_inline())
      std::memcpy(small_, o.small_, inline_bytes);
    else
      new (&large_) std::shared_ptr<bytes>(o.large_);
  }
  slice_value(slice_value&& o) noexcept : size_(o.size_) {
    if (is_inline())
      std::memcpy(small_, o.small_, inline_bytes);
    else
      new (&large_) std::shared_ptr<bytes>(std::move(o.large_));
  }
  slice_value& operator=(slice_value o) noexcept {
    this->~slice_value();
    new (this) slice_value(std::move(o));
    return *this;
  }
  ~slice_value() {
    if (!is_inline()) large_.~shared_ptr();
  }

  std::size_t size() const noexcept { return size_; }
  /// The bytes, written in place (no copy even when a pull answer still sends them: for a
  /// value no answer has read yet, as an init's).
  std::byte* data() noexcept { return is_inline() ? small_ : large_->data(); }
  const std::byte* data() const noexcept { return is_inline() ? small_ : large_->data(); }

  /// The bytes to change: copied first when a pull answer in flight still sends them.
  std::byte* mutable_data() {
    if (is_inline()) return small_;
    if (large_.use_count() > 1) large_ = std::make_shared<bytes>(*large_);
    return large_->data();
  }

  /// What keeps `at` valid for a frame sent later, and `at`: the buffer itself, shared (no
  /// copy), or a copy of a value kept inside the slice (it changes with the next push).
  std::pair<std::shared_ptr<const void>, const std::byte*> share() const {
    if (!is_inline()) return {large_, large_->data()};
    auto copy = std::make_shared<bytes>(small_, small_ + size_);
    const std::byte* at = copy->data();
    return {std::move(copy), at};
  }

  /// `next` (as many bytes: a sync round's sum) becomes the value, and `next` the old value, a
  /// buffer for the next round to reuse (no copy, no allocation); false, nothing changed, when a
  /// pull answer still sends the value.
  bool take(slice_value& next) noexcept {
    if (!is_inline() && large_.use_count() != 1) return false;
    std::swap(*this, next);
    return true;
  }

  /// A batched frame's passes load values some keys ahead: the buffer's block first, then its
  /// bytes (two steps: the block says where the bytes are). Nothing for a value inside the slice.
  void prefetch_block() const noexcept {
    if (!is_inline()) prefetch(large_.get());
  }
  void prefetch_bytes() const noexcept {
    if (!is_inline()) prefetch(large_->data());
  }

 private:
  bool is_inline() const noexcept { return fits_inline(size_); }

  union {
    std::byte small_[inline_bytes];
    std::shared_ptr<bytes> large_;
  };
  std::size_t size_ = 0;
};

}  // namespace kvstore::detail
