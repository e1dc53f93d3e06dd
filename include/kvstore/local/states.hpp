// A local store's optimizer and its states: installing an optimizer (the same registered type
// keeps the states' generation, another starts a new one), and saving and loading every key's
// state in the state file (optim/state_file.hpp), all or nothing.
#pragma once

#include <kvstore/local/store_state.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/optim/state_match.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>

namespace kvstore::detail {

/// Makes `u` the store's optimizer. The caller has waited for every op.
template <class T>
void install_local_optimizer(local_impl<T>& impl, optim::updater<T> u) {
  std::unique_lock lk(impl.m);
  // The same registered type keeps the states' generation, so they carry on with the new
  // parameters; a callable or another type starts a new one.
  const bool same = impl.opt && !u.name.empty() && impl.opt->u.name == u.name;
  const std::uint64_t gen = same ? impl.opt->gen : ++impl.generation;
  impl.opt = std::make_shared<const local_optimizer<T>>(local_optimizer<T>{std::move(u), gen});
}

/// Writes every key's state to `path`. The caller has waited for every op.
template <class T>
void save_local_states(local_impl<T>& impl, const std::filesystem::path& path) {
  std::map<std::uint64_t, optim::key_state<T>> states;
  std::string name;
  {
    std::shared_lock lk(impl.m);
    const std::uint64_t gen = impl.opt ? impl.opt->gen : 0;
    if (impl.opt) name = impl.opt->u.name;
    for (auto& [id, e] : impl.keys) {
      std::lock_guard elk(e->m);
      if (e->state_gen != gen || (e->state.step == 0 && e->state.slots.empty())) continue;
      states.emplace(id, optim::key_state<T>{e->k.name(), e->state});
    }
  }
  optim::save_states<T>(path, name, states);
}

/// Replaces every key's state with the one saved in `path`, all or nothing. The caller has
/// waited for every op.
template <class T>
void load_local_states(local_impl<T>& impl, const std::filesystem::path& path) {
  const auto keep = impl.current_optimizer();
  const auto* opt = keep.get();
  // Read and validate the whole file before looking at (and long before changing) any key.
  auto loaded = optim::load_states<T>(path, opt ? std::string_view(opt->u.name) : "");
  std::shared_lock lk(impl.m);
  const std::size_t slots = opt ? static_cast<std::size_t>(opt->u.num_slots) : 0;
  const auto found = optim::match_states<T>(loaded, impl.keys, slots);
  const std::uint64_t gen = opt ? opt->gen : 0;
  for (auto& [id, e] : impl.keys) {
    std::lock_guard elk(e->m);
    e->state = {};
    e->state_gen = gen;
  }
  for (auto& [e, ks] : found) {
    std::lock_guard elk(e->m);
    e->state = std::move(ks->st);
  }
}

}  // namespace kvstore::detail
