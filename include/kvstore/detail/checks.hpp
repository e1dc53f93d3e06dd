// The argument checks every store makes before it queues anything, with one wording for each
// error: "kvstore: <call> of key <k>: <problem>".
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/key.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvstore::detail {

[[noreturn]] inline void fail(errc c, std::string_view call, const key& k,
                              const std::string& problem) {
  throw error(c, "kvstore: " + std::string(call) + " of key " + k.str() + ": " + problem);
}

inline std::string elems(std::size_t n) {
  return std::to_string(n) + (n == 1 ? " element" : " elements");
}

/// A multi-key call names as many buffers as keys: "push of 3 keys with 2 values",
/// "pull of 3 keys into 2 outputs".
inline void check_count(std::string_view call, std::size_t keys, std::string_view relation,
                        std::size_t bufs, std::string_view bufs_are) {
  if (keys != bufs)
    throw error(errc::invalid_argument, "kvstore: " + std::string(call) + " of " +
                                            std::to_string(keys) + " keys " +
                                            std::string(relation) + " " + std::to_string(bufs) +
                                            " " + std::string(bufs_are));
}

/// `k` names the key stored as `have`, not another key whose name hashes to the same id.
inline void check_same_name(std::string_view call, const key& have, const key& k) {
  if (have.is_named() != k.is_named() || have.name() != k.name())
    fail(errc::invalid_argument, call, k,
         "its id " + std::to_string(k.id()) + " is already taken by key " + have.str());
}

/// A value or output of `n` elements for a key of `total`. `where` (e.g. "on device 1, ")
/// says which buffer, when it helps.
inline void check_size(std::string_view call, const key& k, std::uint64_t total, std::size_t n,
                       std::string_view where = {}) {
  if (n != total)
    fail(errc::size_mismatch, call, k,
         std::string(where) + "size " + std::to_string(n) + " does not match the key's size " +
             std::to_string(total));
}

/// A key's multipliers of the learning rate and weight decay (set_key_options): finite numbers.
inline void check_multipliers(std::string_view call, const key& k, double lr_mult, double wd_mult) {
  if (!std::isfinite(lr_mult) || !std::isfinite(wd_mult))
    fail(errc::invalid_argument, call, k,
         "lr_mult " + std::to_string(lr_mult) + " and wd_mult " + std::to_string(wd_mult) +
             " must be finite");
}

/// The first value of a matrix key: whole rows of row_length.
inline void check_matrix_init(const key& k, std::size_t size, std::size_t row_length) {
  if (row_length == 0) fail(errc::invalid_argument, "init", k, "row_length is 0");
  if (size % row_length != 0)
    fail(errc::size_mismatch, "init", k,
         "size " + std::to_string(size) + " is not a multiple of the row length " +
             std::to_string(row_length));
}

/// "[3, 8)": elements [offset, offset + n) as errors name them.
inline std::string range_str(std::uint64_t offset, std::uint64_t n) {
  const std::uint64_t end = n > ~std::uint64_t{0} - offset ? ~std::uint64_t{0} : offset + n;
  return "[" + std::to_string(offset) + ", " + std::to_string(end) + ")";
}

/// Elements [offset, offset + n) of a key of `total`: not empty, not past the key's end.
inline void check_range(std::string_view call, const key& k, std::uint64_t total,
                        std::uint64_t offset, std::uint64_t n) {
  if (n == 0)
    fail(errc::invalid_argument, call, k,
         "an empty range at offset " + std::to_string(offset) + " (the key has " + elems(total) +
             ")");
  if (offset > total || n > total - offset)
    fail(errc::size_mismatch, call, k,
         "elements " + range_str(offset, n) + " are past the key's end (it has " + elems(total) +
             ")");
}

/// Rows of a matrix key of `total` elements, and `n` elements for them.
inline void check_rows(std::string_view call, const key& k, std::uint64_t total,
                       std::uint64_t row_length, std::span<const std::int64_t> rows,
                       std::size_t n) {
  if (row_length == 0)
    fail(errc::not_a_matrix, call, k, "it was inited without a row length, so it has no rows");
  const auto nrows = static_cast<std::int64_t>(total / row_length);
  for (std::int64_t r : rows)
    if (r < 0 || r >= nrows)
      fail(errc::row_out_of_range, call, k,
           "row " + std::to_string(r) + " is out of range (the key has " + std::to_string(nrows) +
               " rows)");
  if (n != rows.size() * row_length)
    fail(errc::invalid_argument, call, k,
         std::to_string(rows.size()) + " rows of " + std::to_string(row_length) + " need " +
             elems(rows.size() * row_length) + ", given " + std::to_string(n));
}

}  // namespace kvstore::detail
