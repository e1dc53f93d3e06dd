// The keys of a loaded optimizer state file matched to a store's keys and checked against them
// before anything changes: shared by the stores of one process (local, device), so a file one
// saves the other loads with the same errors.
#pragma once

#include <kvstore/detail/checks.hpp>
#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/optim/state_file.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::optim {

/// For each state of `loaded`, the store's entry of its key (from `keys`, a map of key id to a
/// pointer to an entry with `k` and `size`), paired with the state. Throws unknown_key (the
/// store has no such key, or has it under another name) or size_mismatch (a state with slots,
/// but not `slots` arrays of its key's size).
template <class T, class Keys>
auto match_states(std::map<std::uint64_t, key_state<T>>& loaded, const Keys& keys,
                  std::size_t slots) {
  using entry = typename Keys::mapped_type::element_type;
  std::vector<std::pair<entry*, key_state<T>*>> found;
  found.reserve(loaded.size());
  for (auto& [id, ks] : loaded) {
    auto it = keys.find(id);
    const key shown = ks.name.empty() ? key(static_cast<std::int64_t>(id)) : key(ks.name);
    if (it == keys.end() || it->second->k.name() != ks.name)
      detail::fail(errc::unknown_key, "load_optimizer_states", shown,
                   "the file has a state for it, the store has no such key");
    entry& e = *it->second;
    if (!ks.st.slots.empty() &&
        (ks.st.slots.size() != slots || ks.st.slots.front().size() != e.size))
      detail::fail(errc::size_mismatch, "load_optimizer_states", e.k,
                   "saved state has " + std::to_string(ks.st.slots.size()) + " slots of " +
                       detail::elems(ks.st.slots.front().size()) + ", expected " +
                       std::to_string(slots) + " of " + detail::elems(e.size));
    found.emplace_back(&e, &ks);
  }
  return found;
}

}  // namespace kvstore::optim
