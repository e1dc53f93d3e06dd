// The key lists of recent batched frames, with the slices they found (issue 12). A training
// step pushes and pulls the same key lists step after step, and a worker cuts a list into the
// same frames every time, so a server sees the same frames again and again. Finding each key's
// slice in the flat index is a cache miss or two per key, on the io thread that bounds a one
// worker, one server job. A frame seen twice lately is planned: its slices are kept in order,
// and a later frame with the same signature takes key i's slice from the plan, after comparing
// the slice's id, element count and element type with its entry (where the frame's pass reads
// the slice anyway). A plan is valid while the shard frees no slice (key_map::frees: a refused
// batch init, a restore); any free drops them all. Whatever a peer sends, the plans hold at most
// max_plans lists and twice the shard's slices in pointers: a plan is made only of a frame whose
// keys were all found, distinct, so each is at most the shard's size.
#pragma once

#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvstore::detail {

template <class Slice>
class frame_plans {
 public:
  /// Key lists kept (planned, or seen once): frames of a 1e6-key call at the default
  /// chunk_bytes are about 30 per server.
  static constexpr std::size_t max_plans = 128;
  /// A frame of fewer keys is always looked up: its misses are few, and a plan's search is not.
  static constexpr std::size_t min_keys = 32;

  /// The slices planned for a frame naming `entries` of element type `type`, when no slice was
  /// freed since the map read `frees`; or nullptr. Key i may take slice i only if matches().
  const std::vector<Slice*>* find(const wire::batch_entries& entries, wire::dtype type,
                                  std::uint64_t frees) {
    if (entries.size() < min_keys || !valid_at(frees)) return nullptr;
    plan* p = find(signature_of(entries, type));
    if (!p) return nullptr;
    p->used = ++clock_;
    return p->ready ? &p->slices : nullptr;
  }

  /// Whether entry `e` names slice `s` as planned (a frame's other checks still apply).
  static bool matches(const Slice& s, const wire::batch_entry& e, wire::dtype type) noexcept {
    return s.key == e.key && s.total == e.elements && s.type == type;
  }

  /// A frame naming `entries` found `slices` (inited, whole keys, each named once) while the
  /// map read `frees` and held `held` slices. The frame's list is remembered if new, and
  /// planned if seen before.
  void found(const wire::batch_entries& entries, wire::dtype type, std::span<Slice* const> slices,
             std::uint64_t frees, std::size_t held) {
    if (entries.size() < min_keys) return;
    valid_at(frees);
    const signature sig = signature_of(entries, type);
    plan* p = find(sig);
    if (!p) {
      p = make_room_for_list();
      p->sig = sig;
      p->used = ++clock_;
      return;  // seen once: remembered
    }
    p->used = ++clock_;
    drop_slices(*p);
    make_room_for_slices(slices.size(), held, p);
    p->slices.assign(slices.begin(), slices.end());
    pointers_ += slices.size();
    p->ready = true;
  }

  /// Pointers all plans hold.
  std::size_t pointers() const noexcept { return pointers_; }
  /// Key lists kept.
  std::size_t lists() const noexcept { return plans_.size(); }

 private:
  // A frame's key list told apart in constant time. Equal signatures are only a hint: a frame
  // takes a plan's slice only after comparing it with the entry (matches()).
  struct signature {
    std::size_t n = 0;
    wire::dtype type{};
    std::uint64_t first = 0, middle = 0, last = 0;
    friend bool operator==(const signature&, const signature&) = default;
  };
  struct plan {
    signature sig;
    std::uint64_t used = 0;  // the clock when last found or followed
    bool ready = false;      // its slices are kept
    std::vector<Slice*> slices;
  };

  static signature signature_of(const wire::batch_entries& e, wire::dtype type) noexcept {
    const std::size_t n = e.size();
    return {n, type, e[0].key, e[n / 2].key, e[n - 1].key};
  }

  plan* find(const signature& sig) noexcept {
    for (auto& p : plans_)
      if (p.sig == sig) return &p;
    return nullptr;
  }

  // False, dropping every plan, when a slice was freed since they were made.
  bool valid_at(std::uint64_t frees) {
    if (frees == frees_) return true;
    plans_.clear();
    pointers_ = 0;
    frees_ = frees;
    return false;
  }

  void drop_slices(plan& p) noexcept {
    pointers_ -= p.slices.size();
    p.slices = {};
    p.ready = false;
  }

  // A place for a new list: a new one, or the least lately used one's.
  plan* make_room_for_list() {
    if (plans_.size() < max_plans) return &plans_.emplace_back();
    plan* oldest = &*std::min_element(plans_.begin(), plans_.end(),
                                      [](const plan& a, const plan& b) { return a.used < b.used; });
    drop_slices(*oldest);
    *oldest = plan{};
    return oldest;
  }

  // The least lately used plans drop their slices until `n` more fit in twice the `held`
  // slices (or `n` alone, when more). `keep` is the plan being filled.
  void make_room_for_slices(std::size_t n, std::size_t held, const plan* keep) {
    const std::size_t bound = std::max(2 * held, n);
    while (pointers_ + n > bound) {
      plan* oldest = nullptr;
      for (auto& p : plans_)
        if (&p != keep && p.ready && (!oldest || p.used < oldest->used)) oldest = &p;
      if (!oldest) break;
      drop_slices(*oldest);
    }
  }

  std::vector<plan> plans_;
  std::size_t pointers_ = 0;
  std::uint64_t frees_ = 0;  // the map's frees() the plans were made at
  std::uint64_t clock_ = 0;
};

}  // namespace kvstore::detail
