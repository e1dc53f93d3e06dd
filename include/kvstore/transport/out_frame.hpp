// One frame to send: its header, its text, and its payload where the sender keeps it (no copy
// is made on the way to the socket).
#pragma once

#include <kvstore/wire/frame.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kvstore::transport {

/// One frame to send. `payload` points at bytes kept alive by `keep` (or by the caller's op rule).
/// A payload in several places (a fused frame: each caller's value where it lies) is `pieces`
/// instead, in order, `payload_len` bytes together; `payload` is then unused.
struct out_frame {
  wire::header h;
  std::string meta;
  const std::byte* payload = nullptr;
  std::size_t payload_len = 0;
  std::vector<std::span<const std::byte>> pieces;
  std::shared_ptr<const void> keep;
};

}  // namespace kvstore::transport
