// A server slice's value (server/slice_value.hpp): small values inside the slice, larger ones in
// a buffer shared with the pull answers that still send it. What an answer in flight sends never
// changes under it, a round's sum is taken without a copy where it can be, and copies and moves
// keep the bytes.
#include <kvstore/server/slice_value.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

using kvstore::detail::slice_value;

namespace {

// A value of n bytes 1, 2, 3, ...
slice_value counting(std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(i + 1);
  return slice_value(b.data(), n);
}

bool holds(const slice_value& v, std::size_t n, int first) {
  if (v.size() != n) return false;
  for (std::size_t i = 0; i < n; ++i)
    if (v.data()[i] != static_cast<std::byte>(first + static_cast<int>(i))) return false;
  return true;
}

bool inside(const slice_value& v) {
  const auto* at = reinterpret_cast<const std::byte*>(&v);
  return v.data() >= at && v.data() < at + sizeof(v);
}

}  // namespace

TEST_CASE("small values live inside, larger ones outside; both start zeroed" *
          doctest::timeout(10)) {
  for (std::size_t n : {std::size_t{0}, std::size_t{4}, slice_value::inline_bytes,
                        slice_value::inline_bytes + 1, std::size_t{4096}}) {
    CAPTURE(n);
    slice_value v(n);
    CHECK(v.size() == n);
    CHECK(inside(v) == (n <= slice_value::inline_bytes));
    for (std::size_t i = 0; i < n; ++i) CHECK(v.data()[i] == std::byte{0});
    CHECK(holds(counting(n), n, 1));
  }
}

TEST_CASE("an answer in flight keeps the bytes it was sent with, small or large" *
          doctest::timeout(10)) {
  for (std::size_t n : {std::size_t{8}, std::size_t{64}}) {
    CAPTURE(n);
    slice_value v = counting(n);
    auto [keep, at] = v.share();
    REQUIRE(keep != nullptr);
    // Large: the answer reads the value's own buffer (no copy); small: a copy of it.
    CHECK((at == v.data()) == (n > slice_value::inline_bytes));
    std::byte* w = v.mutable_data();  // the next push changes the value
    for (std::size_t i = 0; i < n; ++i) w[i] = std::byte{0x7f};
    for (std::size_t i = 0; i < n; ++i) CHECK(at[i] == static_cast<std::byte>(i + 1));
    CHECK(v.data()[0] == std::byte{0x7f});
    // Once no answer holds it, a large value is changed in place again.
    keep.reset();
    CHECK(v.mutable_data() == v.data());
  }
}

TEST_CASE("a round's sum becomes the value: swapped when no answer holds the value" *
          doctest::timeout(10)) {
  for (std::size_t n : {std::size_t{12}, std::size_t{100}}) {
    CAPTURE(n);
    slice_value v = counting(n), merge(n);
    for (std::size_t i = 0; i < n; ++i) merge.data()[i] = static_cast<std::byte>(50 + i);
    const std::byte* sum_at = merge.data();
    REQUIRE(v.take(merge));
    CHECK(holds(v, n, 50));
    CHECK(holds(merge, n, 1));  // the old value: the next round's buffer
    if (n > slice_value::inline_bytes) CHECK(v.data() == sum_at);  // no copy
    // A large value an answer still sends is not swapped away: nothing changes.
    auto [keep, at] = v.share();
    const bool taken = v.take(merge);
    CHECK(taken == (n <= slice_value::inline_bytes));
    CHECK(holds(v, n, taken ? 1 : 50));
    for (std::size_t i = 0; i < n; ++i) CHECK(at[i] == static_cast<std::byte>(50 + i));
  }
}

TEST_CASE("copies and moves keep the bytes; a copy of a large value shares its buffer" *
          doctest::timeout(10)) {
  for (std::size_t n : {std::size_t{3}, std::size_t{40}}) {
    CAPTURE(n);
    const slice_value a = counting(n);
    slice_value b = a;
    CHECK(holds(b, n, 1));
    CHECK((b.data() == a.data()) == (n > slice_value::inline_bytes));
    b.mutable_data()[0] = std::byte{9};  // copy on write: `a` keeps its bytes
    CHECK(holds(a, n, 1));
    slice_value c = std::move(b);
    CHECK(c.data()[0] == std::byte{9});
    c = a;
    CHECK(holds(c, n, 1));
    c = slice_value(2 * n);  // assigned a value of another size and kind
    CHECK(c.size() == 2 * n);
    CHECK(inside(c) == (2 * n <= slice_value::inline_bytes));
  }
}
