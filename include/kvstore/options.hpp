// Options structs. Local options here; dist options (and from_env) in dist_options.hpp.
#pragma once

#include <cstddef>

namespace kvstore {

/// Options of KVStore<local>.
struct local_options {
  /// Threads of the engine's pool; 0 = the number of cores.
  unsigned threads = 0;
  /// Values of at least this many elements are reduced by all the pool's threads together.
  std::size_t parallel_reduce_min = std::size_t{1} << 16;
};

}  // namespace kvstore
