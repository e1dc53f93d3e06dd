// Boost.Serialization of per-key optimizer state, shared by the optimizer-state file and the
// server checkpoints so both write a state the same way. Include this instead of defining another
// serialize for state<T>.
#pragma once

#include <kvstore/optim/optimizer.hpp>

#include <boost/serialization/vector.hpp>

namespace kvstore::optim {

/// Boost.Serialization of state<T> (found by argument-dependent lookup): the step count and the
/// slots.
template <class Ar, class T>
void serialize(Ar& ar, state<T>& s, unsigned /*version*/) {
  ar & s.step & s.slots;
}

}  // namespace kvstore::optim
