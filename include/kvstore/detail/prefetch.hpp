// Starting to load what a walk over many keys reads some keys before it reads it, so the cache
// misses of several keys overlap (issue 12).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvstore::detail {

// Every prefetch goes through these two. GCC counts a function whose only effect is a prefetch
// (__builtin_prefetch has no side effect it models) as pure, and then drops each call to it as
// unused: a walk's prefetch helper that was not inlined early vanished whole, so the server's
// push walk and the client's key lookups ran with no prefetch at all (objdump: no prefetcht0 in
// them). The empty volatile asm is a side effect: the helper stays impure and its calls stay.

/// Starts loading the cache line of `p` for reading (a hint: nothing is read).
inline void prefetch(const void* p) noexcept {
  __builtin_prefetch(p);
  asm volatile("");
}
/// Starts loading the cache line of `p` for writing.
inline void prefetch_for_write(const void* p) noexcept {
  __builtin_prefetch(p, 1);
  asm volatile("");
}

/// Starts loading every cache line of the `n` bytes at `p`, each line once.
inline void prefetch_bytes(const void* p, std::size_t n) noexcept {
  if (!n) return;
  constexpr std::uintptr_t line = 64;
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (std::uintptr_t l = at & ~(line - 1); l <= at + n - 1; l += line)
    prefetch(reinterpret_cast<const void*>(l));
}

}  // namespace kvstore::detail
