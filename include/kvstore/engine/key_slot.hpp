// The engine's queue of one key, as plain data. A store that keeps a record per key embeds one
// in it (client/key_record.hpp), so queuing an op on a key is a few pointer writes: no lookup, no
// allocation. The engine (engine/engine.hpp) keeps its own, by key id, for callers without records.
#pragma once

#include <cstdint>

namespace kvstore::detail {

struct engine_op;  // engine/engine.hpp
struct key_slot;

/// One key of one op: its place in that key's queue while it waits for the key.
struct key_link {
  engine_op* op = nullptr;
  key_slot* slot = nullptr;
  key_link* next = nullptr;
};

/// Ops waiting for a key, in issue order, behind the op that holds it. An op holds the key until
/// it is done, or, when pipelined, until its requests are on the wire (their order is then kept
/// by the connection): it then streams, and the next op may take the key if it is pipelined and
/// of the same priority (a connection sends a higher priority first). Any other op takes it only
/// once no op streams. 40 bytes. Read and written only under the engine's lock.
struct key_slot {
  key_link* head = nullptr;  // the first op waiting (the holder is not in the queue)
  key_link* tail = nullptr;
  std::uint64_t issued = 0;          // ops queued on the key so far
  std::uint64_t completed = 0;       // and done
  std::int32_t stream_priority = 0;  // theirs: all equal (a connection reorders priorities)
  std::uint16_t streaming = 0;       // pipelined ops past the key, not done yet
  bool held = false;                 // an op holds the key

  bool busy() const noexcept { return issued != completed; }
};

}  // namespace kvstore::detail
