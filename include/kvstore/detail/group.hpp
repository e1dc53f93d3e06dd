// Grouping the buffers of a multi-key call by key, shared by KVStore<local> and KVStore<dist>.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// One key of a multi-key call (its store-specific handle) and the buffers given for it.
template <class Handle, class Buf>
struct key_group {
  Handle h;
  std::vector<Buf> bufs;
};

/// The buffers of a multi-key call grouped by key, in first-appearance order: a key named twice
/// gets both of its buffers in one group (summed for a push, each filled for a pull).
/// `lookup(i)` is the handle of the i-th key (it throws for a bad key, before anything is
/// queued); `same(a, b)` tells whether two handles name one key.
template <class Handle, class Buf, class Lookup, class Same>
std::vector<key_group<Handle, Buf>> group_by_key(std::span<const Buf> bufs, Lookup&& lookup,
                                                 Same&& same) {
  std::vector<key_group<Handle, Buf>> groups;
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    Handle h = lookup(i);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return same(g.h, h); });
    if (it == groups.end())
      groups.push_back({std::move(h), {bufs[i]}});
    else
      it->bufs.push_back(bufs[i]);
  }
  return groups;
}

}  // namespace kvstore::detail
