// The engine's queue of one key, as plain data. A store that keeps a record per key embeds one
// in it (client/key_record.hpp), so queuing an op on a key is a few pointer writes: no lookup, no
// allocation. The engine (engine/engine.hpp) keeps its own, by key id, for callers without records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvstore::detail {

struct engine_op;  // engine/engine.hpp
struct key_slot;

/// One key of one op: its place in that key's queue while it waits for the key.
struct key_link {
  engine_op* op = nullptr;
  key_slot* slot = nullptr;
  key_link* next = nullptr;
};

/// A many-key op's hold on its keys, which outlives the op. Once the op is done, each key it
/// held goes free when the key is next touched (an op queued on it, a wait on it), unless an op
/// queued behind it on some key: then its finish walks its keys, as a one-key op's does. A batch
/// of a multi-key call names thousands of keys; walking them on the thread that read the answer
/// cost ~25 ns a key, each key's record taken from the caller's core and handed back to it by
/// the next call (issue 12). The next op over exactly the same keys, while none was touched,
/// renews the hold instead of queuing on each key (engine::renew): a training step's call of
/// the same key list touches no key's slot at all.
struct key_hold {
  bool done = false;         // the op completed: the keys that still name this hold are free
  bool waited = false;       // an op queued behind it on some key: its finish walks its keys
  std::size_t keys = 0;      // keys that name this hold (it is freed at 0 once done)
  key_hold* prev = nullptr;  // the engine's list of live holds (freed with the engine)
  key_hold* next = nullptr;
  std::vector<key_slot*> slots;  // the op's keys, in its order: what a renewing op must name
};

/// Ops waiting for a key, in issue order, behind the op that holds it. An op holds the key until
/// it is done, or, when pipelined, until its requests are on the wire (their order is then kept
/// by the connection): it then streams, and the next op may take the key if it is pipelined and
/// of the same priority (a connection sends a higher priority first). Any other op takes it only
/// once no op streams. 40 bytes. Read and written only under the engine's lock.
struct key_slot {
  key_link* head = nullptr;  // the first op waiting (the holder is not in the queue)
  key_link* tail = nullptr;
  key_hold* lazy = nullptr;          // held through a many-key op's hold: free once that is done
  std::uint32_t issued = 0;          // ops queued on the key so far (modulo 2^32), an op
                                     // that renewed the key's hold not counted: the hold's one
                                     // op stands for both (engine::renew)
  std::uint32_t completed = 0;       // and done
  std::int32_t stream_priority = 0;  // theirs: all equal (a connection reorders priorities)
  std::uint16_t streaming = 0;       // pipelined ops past the key, not done yet
  bool held = false;                 // an op holds the key

  /// Whether an op issued on the key is not done (a done many-key op whose hold the key still
  /// names is done: nothing waits behind it).
  bool busy() const noexcept { return issued - completed != (lazy && lazy->done ? 1u : 0u); }
  /// Whether every op issued before `target` was read from `issued` is done (wraps safely).
  bool completed_up_to(std::uint32_t target) const noexcept {
    return static_cast<std::int32_t>(completed - target) >= 0;
  }
};

// A key record's first cache line holds its slot beside what a multi-key call reads of it.
static_assert(sizeof(key_slot) == 40, "key_slot grew: key_record's first line no longer fits it");

}  // namespace kvstore::detail
