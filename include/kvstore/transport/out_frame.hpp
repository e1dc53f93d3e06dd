// One frame to send: its header, its text, and its payload where the sender keeps it (no copy
// is made on the way to the socket).
#pragma once

#include <kvstore/wire/frame.hpp>

#include <cstddef>
#include <memory>
#include <string>

namespace kvstore::transport {

/// One frame to send. `payload` points at bytes kept alive by `keep` (or by the caller's op rule).
struct out_frame {
  wire::header h;
  std::string meta;
  const std::byte* payload = nullptr;
  std::size_t payload_len = 0;
  std::shared_ptr<const void> keep;
};

}  // namespace kvstore::transport
