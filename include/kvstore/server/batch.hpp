// A shard's batched requests (issue 12): one frame naming many small keys (wire::decode_batch),
// each a whole key slice, served in one pass over its keys: inits, pushes (summed into each
// key's sync round, or applied at once in dist_async) and pulls (the values one after the other
// in data frames). Every key of a frame is checked before anything changes, so a bad one refuses
// the frame whole, naming the key. A request is answered once, when all its keys are done: a
// countdown per request (batch_waits), not a waiter per key that allocates. A push of many keys
// is served in runs of keys on the apply pool's threads where the machine has cores to spare
// (push_in_runs). The shard (server/shard.hpp) keeps the rules; batch_ops applies them key after
// key: its pulls here, its inits in server/batch_init_ops.hpp, its pushes in
// server/batch_push.hpp, the pass over a frame's keys they share in server/batch_lookup.hpp.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/server/batch_init_ops.hpp>
#include <kvstore/server/batch_lookup.hpp>
#include <kvstore/server/batch_push.hpp>
#include <kvstore/server/batch_waits.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/server/value_answers.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace kvstore::detail {

template <class Port>
class shard;

/// The shard's batched requests (a friend of it: the rules are the shard's).
template <class Port>
struct batch_ops : batch_init_ops<Port>, batch_push_ops<Port> {
  using shard_t = shard<Port>;
  using slice = key_slice<Port>;
  using planned = planned_slice<slice>;

  /// batch_pull: the keys' values one after the other, in data frames of at most chunk_bytes
  /// flagged flag_batch. A batched pull is never held: one that would wait (a slower worker
  /// under bounded staleness) is refused, unsupported, and the worker pulls those keys one by
  /// one.
  static void pull(shard_t& sh, int rank, const Port& from, const wire::header& h,
                   std::string_view meta) {
    const auto entries = wire::decode_batch(meta, h.key, h.total);
    const std::size_t elem = wire::dtype_size(h.type);
    if (!elem || h.total > sh.cfg_.max_frame_bytes / elem)
      throw error(errc::invalid_argument,
                  "a batched pull of " + std::to_string(entries.size()) + " keys and " +
                      std::to_string(h.total) + " elements: more than max_frame_bytes (" +
                      std::to_string(sh.cfg_.max_frame_bytes) + ") in one answer");
    find_slices(
        sh, h, entries,
        [&](const slice& s, const wire::batch_entry&) {
          if (!sh.may_answer(rank, s, 0))
            throw error(errc::unsupported, "key " + shard_t::key_str(s.key) +
                                               ": a batched pull cannot wait for slower workers "
                                               "(staleness); pull it alone");
        },
        sh.gate().may_lag(), slice_pull_bytes);
    const auto& found = sh.batch_slices_;
    auto buf = std::make_shared<bytes>(h.total * elem);
    std::byte* at = buf->data();
    for (std::size_t i = 0; i < entries.size(); ++i) {
      prefetch_ahead(found, entries, elem, i, found.size(), slice_pull_bytes);
      const slice& s = *found[i];
      std::memcpy(at, s.value.data(), s.value.size());
      at += s.value.size();
    }
    using answers = value_answers<Port>;
    answers::send_frames(from, answers::data_header(h, h.total, h.type), buf->data(), h.total, elem,
                         0, wire::flag_batch, buf, sh.cfg_.chunk_bytes);
  }

 private:
  using batch_push_ops<Port>::find_slices;  // batch_lookup's, through one of the two bases
  using batch_push_ops<Port>::prefetch_ahead;
};

}  // namespace kvstore::detail
