// A shard's optimizer states as bytes, out and in: what save_states answers and what
// load_states carries (wire::encode_state_head and wire::decode_states' format, one entry per
// slice), over the shard's slices. The shard (server/shard.hpp) checks the optimizer's name and
// answers the request.
#pragma once

#include <kvstore/detail/key_map.hpp>
#include <kvstore/error.hpp>
#include <kvstore/optim/optimizer.hpp>
#include <kvstore/optim/slots.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/wire/messages.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// Appends the optimizer states of the inited slices that have any to `out`, one entry each;
/// returns how many.
template <class Port>
std::uint64_t encode_states(const key_map<key_slice<Port>>& slices, bytes& out) {
  std::uint64_t count = 0;
  for (auto& entry : slices) {
    // Named, not structured bindings: clang 14 cannot capture those in the lambda below.
    const std::uint64_t k = entry.first;
    auto& s = entry.second;
    if (!s.inited) continue;
    with_dtype(s.type, [&]<class T>() {
      auto& st = s.template state<T>();
      if (st.slots.empty() && st.step == 0) return;
      const auto head = wire::encode_state_head(k, s.type, s.lo, s.hi, s.total, st.step,
                                                static_cast<std::uint32_t>(st.slots.size()));
      auto* p = reinterpret_cast<const std::byte*>(head.data());
      out.insert(out.end(), p, p + head.size());
      for (auto& sl : st.slots) {
        auto* q = reinterpret_cast<const std::byte*>(sl.data());
        out.insert(out.end(), q, q + sl.size() * sizeof(T));
      }
      ++count;
    });
  }
  return count;
}

/// Replaces the optimizer states of the slices that `payload` (encode_states' format) names.
/// Every entry is checked before anything changes: one naming a key not inited here
/// (unknown_key) or not matching its slice (size_mismatch) refuses them all; errors name the
/// server `who`.
template <class Port>
void replace_states(key_map<key_slice<Port>>& slices, std::span<const std::byte> payload,
                    const std::string& who) {
  struct staged {
    key_slice<Port>* s;
    optim::state<float> f;
    optim::state<double> d;
  };
  std::vector<staged> all;
  for (const auto& e :
       wire::decode_states({reinterpret_cast<const char*>(payload.data()), payload.size()})) {
    auto it = slices.find(e.key);
    if (it == slices.end() || !it->second.inited)
      throw error(errc::unknown_key,
                  "optimizer states name key " + key_str(e.key) + ", unknown on " + who);
    key_slice<Port>& s = it->second;
    if (s.type != e.type || s.lo != e.lo || s.hi != e.hi || s.total != e.total ||
        e.nslots > optim::max_slots)
      throw error(errc::size_mismatch, "optimizer states of key " + key_str(e.key) +
                                           " do not match its slice on " + who);
    staged st{&s, {}, {}};
    with_dtype(e.type, [&]<class T>() {
      optim::state<T>& dst = [&]() -> optim::state<T>& {
        if constexpr (std::is_same_v<T, float>)
          return st.f;
        else
          return st.d;
      }();
      dst.step = e.step;
      dst.slots.resize(e.nslots);
      for (std::uint32_t i = 0; i < e.nslots; ++i) {
        auto raw = e.slot(i);
        dst.slots[i].resize(e.hi - e.lo);
        std::memcpy(dst.slots[i].data(), raw.data(), raw.size());
      }
    });
    all.push_back(std::move(st));
  }
  for (auto& st : all) {
    st.s->st_f = std::move(st.f);
    st.s->st_d = std::move(st.d);
  }
}

}  // namespace kvstore::detail
