// Saving and loading a device store's optimizer states: copied between the owners and the state
// file of KVStore<local> (optim/state_file.hpp), so a file one saves, the other loads.
#pragma once

#include <kvstore/device/buffer.hpp>
#include <kvstore/device/store_state.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/optim/state_match.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::detail {

/// Writes every key's state (copied from its owner) to `path`. The caller has waited for every op.
template <class T>
void save_device_states(device_impl<T>& impl, const std::filesystem::path& path) {
  std::map<std::uint64_t, optim::key_state<T>> states;
  std::string name;
  {
    std::shared_lock lk(impl.m);
    const std::uint64_t gen = impl.opt ? impl.opt->gen : 0;
    if (impl.opt) name = impl.opt->u.name;
    for (auto& [id, e] : impl.keys) {
      std::lock_guard elk(e->m);
      if (e->state_gen != gen || (e->step == 0 && e->slots.empty())) continue;
      optim::key_state<T> ks{e->k.name(), {}};
      ks.st.step = e->step;
      for (auto& s : e->slots) ks.st.slots.push_back(s.to_host());
      states.emplace(id, std::move(ks));
    }
  }
  optim::save_states<T>(path, name, states);
}

/// Replaces every key's state with the one in `path`, all or nothing: the file is read and
/// checked, and the states copied to the owners, before any key changes. The caller has waited
/// for every op.
template <class T>
void load_device_states(device_impl<T>& impl, const std::filesystem::path& path) {
  const auto keep = impl.current_optimizer();
  const auto* opt = keep.get();
  auto loaded = optim::load_states<T>(path, opt ? std::string_view(opt->u.name) : "");
  std::shared_lock lk(impl.m);
  const std::size_t slots = opt ? static_cast<std::size_t>(opt->u.num_slots) : 0;
  const auto found = optim::match_states<T>(loaded, impl.keys, slots);
  // Upload first (may fail: out of memory), then swap in, so a failure changes nothing.
  std::vector<std::vector<device_buffer<T>>> up;
  for (auto& [e, ks] : found) {
    std::vector<device_buffer<T>> s;
    for (auto& sl : ks->st.slots) s.emplace_back(std::span<const T>(sl), e->owner);
    up.push_back(std::move(s));
  }
  const std::uint64_t gen = opt ? opt->gen : 0;
  for (auto& [id, e] : impl.keys) {
    std::lock_guard elk(e->m);
    e->slots.clear();
    e->step = 0;
    e->state_gen = gen;
  }
  for (std::size_t i = 0; i < found.size(); ++i) {
    std::lock_guard elk(found[i].first->m);
    found[i].first->step = found[i].second->st.step;
    found[i].first->slots = std::move(up[i]);
  }
}

}  // namespace kvstore::detail
