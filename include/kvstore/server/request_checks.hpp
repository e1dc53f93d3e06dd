// The checks of a request against a key's slice on a server: the encoding it names, the elements,
// range or rows it touches. Each throws kvstore::error naming the key, before anything changes;
// the shard (server/shard.hpp) finds the slice and decides what follows. Static members of a
// struct, so they never mix with detail/checks.hpp's worker-side checks of the same names.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>
#include <kvstore/wire/meta.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::detail {

template <class Slice>
struct slice_checks {
  /// Element ranges (push_range, pull_range) travel plain.
  static void refuse_encoded_range(const wire::header& h) {
    if (wire::encoding_bits(h.flags))
      throw error(errc::unsupported,
                  "key " + key_str(h.key) + ": a range push or pull in encoding " +
                      std::to_string(wire::encoding_bits(h.flags)) + ": ranges travel plain");
  }

  /// The 16-bit encoding a pull asks for: an unknown one is unsupported, 2 bits a bad argument.
  static wire::encoding pull_encoding(const wire::header& h) {
    const wire::encoding e = known_encoding(h, "pull");
    if (!wire::is_16bit(e))
      throw error(errc::invalid_argument, "key " + key_str(h.key) + ": a pull in " +
                                              wire::encoding_name(e) +
                                              ": 2-bit compression applies to pushes only");
    return e;
  }

  /// The encoding a push or pull names in its flags; one this server does not know is an error
  /// `code` (unsupported: the request is refused, its connection kept).
  static wire::encoding known_encoding(const wire::header& h, const char* what,
                                       errc code = errc::unsupported) {
    const unsigned bits = wire::encoding_bits(h.flags);
    if (bits >= wire::encoding_count)
      throw error(code, "key " + key_str(h.key) + ": a " + what + " in encoding " +
                            std::to_string(bits) + ", which this server does not know (0-" +
                            std::to_string(wire::encoding_count - 1) + ")");
    return static_cast<wire::encoding>(bits);
  }

  /// Checks that payload elements [offset, offset + n) lie in the slice.
  static std::uint64_t check_range(const Slice& s, const wire::header& h, std::size_t payload_len) {
    return check_elements(s, h, payload_len / s.elem());
  }
  static std::uint64_t check_elements(const Slice& s, const wire::header& h, std::uint64_t n) {
    if (h.offset < s.lo || h.offset > s.hi || n > s.hi - h.offset)
      throw error(errc::size_mismatch,
                  "key " + key_str(h.key) + ": elements [" + std::to_string(h.offset) + ", " +
                      std::to_string(h.offset + n) + ") are outside this server's slice [" +
                      std::to_string(s.lo) + ", " + std::to_string(s.hi) + ")");
    return n;
  }

  /// The range a range push's or pull's meta names: it must lie in this server's slice (`who`
  /// names the server in the error).
  static wire::range_meta range_in_slice(const Slice& s, const wire::header& h,
                                         std::string_view meta, const std::string& who) {
    const wire::range_meta r = wire::decode_range(meta);  // not empty, no wrap: else protocol
    if (r.offset < s.lo || r.offset > s.hi || r.length > s.hi - r.offset)
      throw error(errc::size_mismatch,
                  "key " + key_str(h.key) + ": range [" + std::to_string(r.offset) + ", " +
                      std::to_string(r.offset + r.length) + ") is outside this server's slice [" +
                      std::to_string(s.lo) + ", " + std::to_string(s.hi) + ") on " + who);
    return r;
  }

  /// A frame of a range push: its elements lie in the range its meta names, and the range in the
  /// slice. The frame is then a push like any other: in dist_sync it counts as this worker's push
  /// of the slice for the round, and the round's coverage keeps the elements it did not write.
  static void check_range_push(const Slice& s, const wire::header& h, std::string_view meta,
                               std::size_t payload_len, const std::string& who) {
    const wire::range_meta r = range_in_slice(s, h, meta, who);
    const std::uint64_t n = payload_len / s.elem();
    if (h.offset < r.offset || h.offset - r.offset > r.length ||
        n > r.length - (h.offset - r.offset))
      throw error(errc::size_mismatch,
                  "key " + key_str(h.key) + ": elements [" + std::to_string(h.offset) + ", " +
                      std::to_string(h.offset + n) + ") of a range push are outside its range [" +
                      std::to_string(r.offset) + ", " + std::to_string(r.offset + r.length) + ")");
  }

  /// The rows a push_rows or pull_rows meta lists, each one of this server's rows.
  static std::vector<std::int64_t> check_rows(const Slice& s, const wire::header& h,
                                              std::string_view meta) {
    if (!s.row_length)
      throw error(errc::not_a_matrix, "key " + key_str(h.key) + " was inited without a row length");
    auto rows = wire::decode_rows(meta);
    const auto rlo = static_cast<std::int64_t>(s.lo / s.row_length),
               rhi = static_cast<std::int64_t>(s.hi / s.row_length);
    for (auto r : rows)
      if (r < rlo || r >= rhi)
        throw error(errc::row_out_of_range, "key " + key_str(h.key) + ": row " + std::to_string(r) +
                                                " is outside this server's rows [" +
                                                std::to_string(rlo) + ", " + std::to_string(rhi) +
                                                ")");
    return rows;
  }

  /// Refuses a pull_rows that names a row more than once.
  static void refuse_repeated_rows(std::uint64_t key, std::span<const std::int64_t> rows) {
    std::vector<std::int64_t> sorted(rows.begin(), rows.end());
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end())
      throw error(errc::invalid_argument, "key " + key_str(key) + ": pull_rows names row " +
                                              std::to_string(*twice) + " more than once");
  }
};

}  // namespace kvstore::detail
