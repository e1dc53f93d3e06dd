// Mode tags and the store's declaration: the small vocabulary every other header uses, with the
// key and op types it hands out.
#pragma once

#include <kvstore/key.hpp>
#include <kvstore/op.hpp>

namespace kvstore {

/// Mode tag: one process, one or many devices.
struct local {};
/// Mode tag: worker processes talking to server processes over TCP.
struct dist {};

template <class Mode, class T = float>
class KVStore;

}  // namespace kvstore
