// Boost.Serialization of per-key optimizer state, for the optimizer-state file (a trusted local
// file). Server snapshots and the wire carry the same slots as raw bytes (wire/snapshot.hpp,
// wire/messages.hpp). Include this instead of defining another serialize for state<T>.
#pragma once

#include <kvstore/optim/optimizer.hpp>

#include <boost/serialization/binary_object.hpp>
#include <boost/serialization/split_free.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <streambuf>
#include <string>

namespace kvstore::detail {
/// While a state-file payload is decoded (optim::parse_states), the bytes it has left, so a
/// length field is checked before anything is allocated for it; null otherwise.
inline thread_local std::streambuf* state_decoding_from = nullptr;

/// Throws std::length_error when `bytes` more cannot be in what is being decoded.
inline void check_decodable(std::uint64_t bytes, const char* what) {
  std::streambuf* src = state_decoding_from;
  if (!src) return;
  const std::streamsize left = src->in_avail();
  if (left < 0 || bytes > static_cast<std::uint64_t>(left))
    throw std::length_error(std::string(what) + " of " + std::to_string(bytes) +
                            " bytes in a payload with " + std::to_string(left < 0 ? 0 : left) +
                            " left");
}
}  // namespace kvstore::detail

namespace kvstore::optim {

/// Boost.Serialization of state<T> (found by argument-dependent lookup): the step count, the
/// number of slots, then each slot as its element count and raw elements. Lengths are explicit
/// so the loader checks them (against max_slots and the bytes present) before allocating:
/// Boost's own vector loader allocates whatever count a corrupt payload names (found by
/// fuzz/fuzz_state_file.cpp).
template <class Ar, class T>
void save(Ar& ar, const state<T>& s, unsigned /*version*/) {
  const std::uint64_t nslots = s.slots.size();
  ar& s.step& nslots;
  for (const auto& sl : s.slots) {
    const std::uint64_t n = sl.size();
    ar& n;
    if (n) ar& boost::serialization::make_binary_object(const_cast<T*>(sl.data()), n * sizeof(T));
  }
}

template <class Ar, class T>
void load(Ar& ar, state<T>& s, unsigned /*version*/) {
  std::uint64_t step = 0, nslots = 0;
  ar& step& nslots;
  if (nslots > static_cast<std::uint64_t>(max_slots))
    throw std::length_error("optimizer state with " + std::to_string(nslots) + " slots, at most " +
                            std::to_string(max_slots) + " exist");
  std::vector<std::vector<T>> slots(static_cast<std::size_t>(nslots));
  for (auto& sl : slots) {
    std::uint64_t n = 0;
    ar& n;
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T))
      throw std::length_error("optimizer state slot of " + std::to_string(n) + " elements");
    kvstore::detail::check_decodable(n * sizeof(T), "optimizer state slot");
    sl.resize(static_cast<std::size_t>(n));
    if (n) ar& boost::serialization::make_binary_object(sl.data(), n * sizeof(T));
  }
  s.step = step;
  s.slots = std::move(slots);
}

template <class Ar, class T>
void serialize(Ar& ar, state<T>& s, unsigned version) {
  boost::serialization::split_free(ar, s, version);
}

}  // namespace kvstore::optim
