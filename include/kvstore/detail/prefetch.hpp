// Starting to load what a walk over many keys reads some keys before it reads it, so the cache
// misses of several keys overlap (issue 12).
#pragma once

#include <cstddef>

namespace kvstore::detail {

/// Starts loading every cache line of the `n` bytes at `p` (a hint: nothing is read): a line
/// every 64 bytes from p, and the line of the last byte, which that misses when p does not
/// start a line.
inline void prefetch_bytes(const void* p, std::size_t n) noexcept {
  const char* c = static_cast<const char*>(p);
  for (std::size_t at = 0; at < n; at += 64) __builtin_prefetch(c + at);
  if (n) __builtin_prefetch(c + n - 1);
}

}  // namespace kvstore::detail
