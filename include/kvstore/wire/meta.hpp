// Metadata writer/reader for control messages: length-checked little-endian fields. Small and
// strict by design, so a fuzzer can hit every path and nothing a peer sends can over-read.
#pragma once

#include <kvstore/error.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::wire {

class meta_writer {
 public:
  meta_writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) s_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  meta_writer& u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) s_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  meta_writer& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  meta_writer& str(std::string_view v) {
    u32(static_cast<std::uint32_t>(v.size()));
    s_.append(v);
    return *this;
  }
  /// Appends raw bytes (no length prefix).
  meta_writer& raw(std::string_view v) {
    s_.append(v);
    return *this;
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

/// Throws kvstore::error(errc::protocol) on any read past the end or an implausible length.
class meta_reader {
 public:
  explicit meta_reader(std::string_view s) : s_(s) {}
  std::uint32_t u32() {
    need(4);
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s_[pos_ + i]);
    pos_ += 4;
    return v;
  }
  std::uint64_t u64() {
    need(8);
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s_[pos_ + i]);
    pos_ += 8;
    return v;
  }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  std::string str() {
    auto n = u32();
    need(n);
    std::string v(s_.substr(pos_, n));
    pos_ += n;
    return v;
  }
  /// The next n raw bytes.
  std::string_view bytes(std::size_t n) {
    need(n);
    auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::size_t remaining() const noexcept { return s_.size() - pos_; }
  bool done() const noexcept { return pos_ == s_.size(); }

 private:
  void need(std::size_t n) const {
    if (s_.size() - pos_ < n) throw error(errc::protocol, "truncated control message");
  }
  std::string_view s_;
  std::size_t pos_ = 0;
};

/// Row ids travel as raw little-endian int64 arrays in the metadata.
inline std::string encode_rows(const std::int64_t* rows, std::size_t n) {
  std::string s(n * 8, '\0');
  static_assert(sizeof(std::int64_t) == 8);
  if constexpr (std::endian::native == std::endian::little) {
    if (n) std::memcpy(s.data(), rows, n * 8);
  } else {
    for (std::size_t i = 0; i < n; ++i)
      for (int b = 0; b < 8; ++b)
        s[i * 8 + b] = static_cast<char>(static_cast<std::uint64_t>(rows[i]) >> (8 * b));
  }
  return s;
}
inline std::vector<std::int64_t> decode_rows(std::string_view s) {
  if (s.size() % 8 != 0) throw error(errc::protocol, "row list is not a whole number of int64");
  std::vector<std::int64_t> rows(s.size() / 8);
  meta_reader r(s);
  for (auto& x : rows) x = r.i64();
  return rows;
}

}  // namespace kvstore::wire
