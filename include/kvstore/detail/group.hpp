// Grouping the buffers of a multi-key call by key, shared by KVStore<local> and KVStore<dist>.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <unordered_map>
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
/// queued); `same(a, b)` tells whether two handles name one key, and equal handles must hash
/// equal (`std::hash<Handle>`): past a few keys the groups are found through a hash table, so
/// the cost stays linear in the number of keys.
template <class Handle, class Buf, class Lookup, class Same>
std::vector<key_group<Handle, Buf>> group_by_key(std::span<const Buf> bufs, Lookup&& lookup,
                                                 Same&& same) {
  constexpr std::size_t scan_below = 16;  // a short scan beats hashing for small calls
  std::vector<key_group<Handle, Buf>> groups;
  groups.reserve(bufs.size());
  std::unordered_map<Handle, std::size_t> index;
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    Handle h = lookup(i);
    std::size_t at = groups.size();
    if (groups.size() < scan_below) {
      for (std::size_t g = 0; g < groups.size(); ++g)
        if (same(groups[g].h, h)) {
          at = g;
          break;
        }
    } else {
      if (index.empty())
        for (std::size_t g = 0; g < groups.size(); ++g) index.emplace(groups[g].h, g);
      at = index.try_emplace(h, groups.size()).first->second;
    }
    if (at == groups.size())
      groups.push_back({std::move(h), {bufs[i]}});
    else
      groups[at].bufs.push_back(bufs[i]);
  }
  return groups;
}

}  // namespace kvstore::detail
