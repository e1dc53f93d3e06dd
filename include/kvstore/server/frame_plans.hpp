// The key lists of recent batched frames, with the slices they found (issue 12). A training
// step pushes and pulls the same key lists step after step, and a worker cuts a list into the
// same frames every time, so a server sees the same frames again and again. Finding each key's
// slice in the flat index is a cache miss or two per key, on the io thread that bounds a one
// worker, one server job. A frame seen twice lately is planned (the rules are
// detail/list_plans.hpp's): its slices are kept in order, each with the key id and element count
// it was found for, and a later frame with the same signature (its element type included) takes
// key i's slice from the plan after comparing its entry with that copy. The copy, read in order,
// spares the frame's pass a cache miss per key when nothing else of the slice needs reading
// before the frame changes anything (batch_ops::find_slices). A slice's id, size and element
// type never change while it lives, so a plan is valid while the shard frees no slice
// (key_map::frees: a refused batch init, a restore); any free drops them all. Whatever a peer
// sends, the plans hold at most max_plans lists and twice the shard's slices in entries: a plan
// is made only of a frame whose keys were all found, distinct, so each is at most the shard's
// size.
#pragma once

#include <kvstore/detail/list_plans.hpp>
#include <kvstore/wire/messages.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvstore::detail {

/// Key i of a planned frame: its slice, and the id and element count it was found for.
template <class Slice>
struct planned_slice {
  Slice* slice = nullptr;
  std::uint64_t key = 0, elements = 0;

  /// Whether entry `e` names this slice (a frame's other checks still apply).
  bool names(const wire::batch_entry& e) const noexcept {
    return key == e.key && elements == e.elements;
  }
};

template <class Slice>
class frame_plans {
 public:
  using entry = planned_slice<Slice>;

  /// Key lists planned (and as many more remembered, seen once): a 1e6-key call is 245 frames
  /// (client/batch.hpp: batch_frame_keys), over its servers.
  static constexpr std::size_t max_plans = 512;
  /// A frame of fewer keys is always looked up: its misses are few, and a plan's search is not.
  static constexpr std::size_t min_keys = 32;

  /// The slices planned for a frame naming `entries` of element type `type` (the signature
  /// holds it, compared exactly), when no slice was freed since the map read `frees`; or
  /// nullptr. Key i may take slice i only if entry i names() it.
  const std::vector<entry>* find(const wire::batch_entries& entries, wire::dtype type,
                                 std::uint64_t frees) {
    if (entries.size() < min_keys || !plans_.valid_at(frees)) return nullptr;
    const auto* p = plans_.find(signature_of(entries, type));
    return p ? &p->entries() : nullptr;
  }

  /// A frame naming `entries` found `slices` (inited, whole keys, each named once) while the
  /// map read `frees` and held `held` slices. The frame's list is remembered if new, and
  /// planned if seen before.
  void found(const wire::batch_entries& entries, wire::dtype type, std::span<Slice* const> slices,
             std::uint64_t frees, std::size_t held) {
    if (entries.size() < min_keys) return;
    plans_.valid_at(frees);
    auto* p = plans_.start(signature_of(entries, type), slices.size(), held);
    if (!p) return;  // seen once: remembered
    for (std::size_t i = 0; i < slices.size(); ++i)
      p->add(entry{slices[i], entries[i].key, entries[i].elements});
    plans_.finish(*p);
  }

  /// Entries all plans hold room for.
  std::size_t pointers() const noexcept { return plans_.entries(); }
  /// Key lists planned.
  std::size_t lists() const noexcept { return plans_.lists(); }
  /// Key lists remembered, seen once.
  std::size_t remembered() const noexcept { return plans_.remembered(); }

 private:
  static list_signature signature_of(const wire::batch_entries& e, wire::dtype type) {
    return list_signature::of(
        e.size(), [&](std::size_t i) { return e[i].key; }, static_cast<std::uint64_t>(type));
  }

  list_plans<entry, std::uint64_t, max_plans> plans_;
};

}  // namespace kvstore::detail
