// kvstore::key: an integer or a name, as the contract lets a caller name a key.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvstore {

/// A key: an integer or a name. Implicit from any integer, std::string, std::string_view and
/// string literal. Names are hashed to a 64-bit id (top bit set); the name is kept for messages
/// and to detect the (unlikely) collision of two names.
class key {
 public:
  template <std::integral I>
  requires(!std::same_as<I, bool>) key(I v)
  noexcept  // NOLINT(google-explicit-constructor): implicit by contract
      : id_(static_cast<std::uint64_t>(static_cast<std::int64_t>(v))) {}
  key(std::string_view name) : id_(hash(name)), name_(name), named_(true) {}  // NOLINT
  key(const std::string& name) : key(std::string_view(name)) {}               // NOLINT
  key(const char* name) : key(std::string_view(name)) {}                      // NOLINT

  /// The id that identifies the key in stores and on the wire.
  std::uint64_t id() const noexcept { return id_; }
  bool is_named() const noexcept { return named_; }
  /// The name for a named key, empty for an integer key.
  const std::string& name() const noexcept { return name_; }
  /// For messages: `3` or `"fc1.w"`.
  std::string str() const {
    return named_ ? "\"" + name_ + "\"" : std::to_string(static_cast<std::int64_t>(id_));
  }

  friend bool operator==(const key& a, const key& b) noexcept { return a.id_ == b.id_; }

  /// FNV-1a 64 with the top bit set, so names rarely meet small non-negative integer keys.
  static constexpr std::uint64_t hash(std::string_view s) noexcept {
    std::uint64_t h = 14695981039346656037ull;
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    return h | (1ull << 63);
  }

 private:
  std::uint64_t id_;
  std::string name_;
  bool named_ = false;
};

}  // namespace kvstore
