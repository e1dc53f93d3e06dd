// The one bound on optimizer state slots, read by the optimizers, the state file, the wire's
// state entries and server snapshots alike.
#pragma once

namespace kvstore::optim {

/// Most state slots any optimizer keeps per element (adam: mean and variance).
inline constexpr int max_slots = 2;

}  // namespace kvstore::optim
