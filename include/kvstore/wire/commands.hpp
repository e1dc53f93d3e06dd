// One constructor per request command: each sets the header fields its command uses, so a
// field's meaning for a command is written in one place in the code. The table of those meanings,
// command by command, is docs/DESIGN.md's "Wire format" (kept there, where it stays readable;
// the copy that was here had fallen behind it). Control payloads (the metadata) are encoded by
// wire/messages.hpp; tensor bytes travel raw as the payload.
//
// Every frame carries req_id (answers repeat it), priority (the sender's send order), sender (its
// node id), type (element type of a payload) and status (errc of a response).
//
// Versions (issue 13): a pull's or pull_rows' aux is the version the slice must reach before it
// is answered (0: at once); version (key id, key's elements, type) is answered by a response
// whose aux is the slice's version.
#pragma once

#include <kvstore/wire/frame.hpp>

#include <cstdint>

namespace kvstore::wire {

/// A frame of `c` with nothing else set: barrier, leave, bye, checkpoint, save_states, ...
inline header plain(cmd c) {
  header h;
  h.command = c;
  return h;
}

/// Where a key's elements go: the fields every data command shares.
struct key_fields {
  std::uint64_t key = 0;
  std::uint64_t total = 0;
  dtype type = dtype::none;
};

inline header init_header(const key_fields& k, std::uint64_t row_length, std::uint64_t offset,
                          bool last, bool has_data) {
  header h = plain(cmd::init);
  h.key = k.key;
  h.total = k.total;
  h.type = k.type;
  h.aux = row_length;
  h.offset = offset;
  h.flags = (last ? flag_last : 0u) | (has_data ? flag_has_data : 0u);
  return h;
}

inline header push_header(const key_fields& k, std::uint64_t offset, std::uint64_t push_number,
                          bool last, int priority) {
  header h = plain(cmd::push);
  h.key = k.key;
  h.total = k.total;
  h.type = k.type;
  h.offset = offset;
  h.aux = push_number;
  h.flags = last ? flag_last : 0u;
  h.priority = priority;
  return h;
}

/// `min_version` (aux): the server answers once the slice reached it (0: at once).
inline header pull_header(const key_fields& k, std::uint64_t slice_lo, int priority,
                          std::uint64_t min_version = 0) {
  header h = plain(cmd::pull);
  h.key = k.key;
  h.total = k.total;
  h.type = k.type;
  h.offset = slice_lo;
  h.priority = priority;
  h.aux = min_version;
  return h;
}

inline header push_rows_header(const key_fields& k, std::uint64_t push_number, bool last,
                               int priority) {
  header h = plain(cmd::push_rows);
  h.key = k.key;
  h.total = k.total;
  h.type = k.type;
  h.aux = push_number;
  h.flags = last ? flag_last : 0u;
  h.priority = priority;
  return h;
}

inline header pull_rows_header(const key_fields& k, int priority) {
  header h = plain(cmd::pull_rows);
  h.key = k.key;
  h.total = k.total;
  h.type = k.type;
  h.priority = priority;
  return h;
}

/// A frame of a range push: elements [offset, offset + n) of the key, inside the range its
/// meta names (wire::range_meta).
inline header push_range_header(const key_fields& k, std::uint64_t offset,
                                std::uint64_t push_number, bool last, int priority) {
  header h = push_header(k, offset, push_number, last, priority);
  h.flags |= flag_range;
  return h;
}

/// A range pull: the elements its meta names (wire::range_meta), from their first (`offset`).
inline header pull_range_header(const key_fields& k, std::uint64_t offset, int priority) {
  header h = pull_header(k, offset, priority);
  h.flags = flag_range;
  return h;
}

/// A key's learning-rate and weight-decay multipliers (meta: encode_key_multipliers), to each
/// server holding a slice of it.
inline header key_options_header(const key_fields& k) {
  header h = plain(cmd::key_options);
  h.key = k.key;
  h.total = k.total;
  h.type = k.type;
  return h;
}

/// Asks for a key slice's version: rounds completed (dist_sync) or pushes applied (dist_async),
/// answered in the response's aux.
inline header version_header(const key_fields& k) {
  header h = plain(cmd::version);
  h.key = k.key;
  h.total = k.total;
  h.type = k.type;
  return h;
}

/// A batched request (batch_init, batch_push, batch_pull; issue 12): `keys` whole key slices,
/// named in the meta (wire::encode_batch_entry), of `elements` elements together: the payload's
/// (batch_init with `has_data`, batch_push) or the answer's (batch_pull, answered by data frames
/// flagged flag_batch whose offsets count elements from the first key's first).
inline header batch_header(cmd c, dtype t, std::uint64_t keys, std::uint64_t elements, int priority,
                           bool has_data = false, bool each = false) {
  header h = plain(c);
  h.type = t;
  h.key = keys;
  h.total = elements;
  h.priority = priority;
  h.flags = flag_last | (has_data ? flag_has_data : 0u) | (each ? flag_each : 0u);
  return h;
}

inline header dead_count_header(int groups, std::uint64_t timeout_ms) {
  header h = plain(cmd::dead_count);
  h.key = static_cast<std::uint64_t>(groups);
  h.total = timeout_ms;
  return h;
}

inline header command_header(int head) {
  header h = plain(cmd::command);
  h.key = static_cast<std::uint64_t>(static_cast<std::int64_t>(head));
  return h;
}

}  // namespace kvstore::wire
