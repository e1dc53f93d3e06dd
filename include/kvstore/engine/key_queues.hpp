// Which op holds which key and which ops are ready: the engine's queues as plain bookkeeping.
// Every step runs under the engine's lock (m_) and neither blocks nor wakes a thread, so the rules
// of key order (streams, lazy holds, renewals) read apart from the pool that runs the ops.
#pragma once

#include <kvstore/engine/engine_op.hpp>
#include <kvstore/engine/key_slot.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <span>
#include <vector>

namespace kvstore::detail {

class key_queues {
 protected:
  // Strict weak order: higher priority first, then lower sequence (issue order) first.
  struct op_less {
    bool operator()(const engine_op* a, const engine_op* b) const noexcept {
      if (a->priority != b->priority) return a->priority < b->priority;
      return a->seq > b->seq;
    }
  };

  // Whether `op` may take `slot` when no op holds it: once none streams, or, pipelined, behind
  // fewer than max_pipeline_ of its own priority (a connection keeps only their order).
  bool may_take(const engine_op* op, const key_slot& slot) const noexcept {
    return slot.streaming == 0 || (op->pipelined && slot.streaming < max_pipeline_ &&
                                   op->priority == slot.stream_priority);
  }

  // Queues `op` on `slot` through `link` (m_ held): it holds the key at once when it is free,
  // else waits behind the ops queued before it.
  void enqueue(engine_op* op, key_slot& slot, key_link& link) {
    link.op = op;
    link.slot = &slot;
    link.next = nullptr;
    settle(slot);
    ++slot.issued;
    if (!slot.held && !slot.head && may_take(op, slot)) {  // free: the op holds it now
      take(op, slot);
      return;
    }
    if (slot.lazy) slot.lazy->waited = true;  // its finish lets this op in
    if (slot.tail)
      slot.tail->next = &link;
    else
      slot.head = &link;
    slot.tail = &link;
    ++op->waiting;
  }

  // `op` holds `slot` now (m_ held); through its hold, if it has one.
  static void take(engine_op* op, key_slot& slot) {
    op->run_info.behind_stream = slot.streaming > 0;
    slot.held = true;
    if (!op->hold) return;
    slot.lazy = op->hold;
    ++op->hold->keys;
    if (slot.head) op->hold->waited = true;  // ops wait behind it
  }

  // A key held through the hold of a many-key op that is done goes free now (m_ held).
  void settle(key_slot& slot) {
    key_hold* h = slot.lazy;
    if (!h || !h->done) return;
    slot.lazy = nullptr;
    slot.held = false;
    ++slot.completed;
    if (--h->keys == 0) unlink_hold(h);
  }

  // An op over exactly the keys of a done hold that every one of them still names (none was
  // touched since: an op queued on a key, or a wait on it, settles it and lowers the count) and
  // no op waited behind takes them all through that hold, made not done again, without reading
  // or writing any key's slot (m_ held). Queuing it would have given it every key at once too.
  // Each key's one unsettled op then stands for this one: busy() and wait_slot see an op in
  // flight until this one is done. Not while a wait_slot waits: it read its target before, and
  // would wait for this op too (a stream of renewals could keep it waiting).
  bool renew(engine_op* op, std::span<key_slot* const> slots) {
    key_hold* h = slots.front()->lazy;
    if (!h || !h->done || h->waited || key_waiters_ != 0 || h->keys != slots.size() ||
        !std::equal(slots.begin(), slots.end(), h->slots.begin(), h->slots.end()))
      return false;
    h->done = false;
    op->hold = h;
    key_link* links = op->links();  // for finish's walk, should an op queue behind this one
    for (std::size_t i = 0; i < slots.size(); ++i) {
      links[i].op = op;
      links[i].slot = slots[i];
    }
    return true;
  }

  key_hold* new_hold() {
    auto* h = new key_hold;
    h->next = holds_;
    if (holds_) holds_->prev = h;
    holds_ = h;
    return h;
  }
  void unlink_hold(key_hold* h) noexcept {
    (h->prev ? h->prev->next : holds_) = h->next;
    if (h->next) h->next->prev = h->prev;
    delete h;
  }

  // The key is not held (m_ held): its first waiting op takes it if it may. Returns whether an
  // op became ready.
  bool advance(key_slot& slot) {
    key_link* next = slot.head;
    if (slot.held || !next || !may_take(next->op, slot)) return false;
    slot.head = next->next;
    if (!slot.head) slot.tail = nullptr;
    take(next->op, slot);
    if (--next->op->waiting) return false;
    ready_.push(next->op);
    return true;
  }

  std::priority_queue<engine_op*, std::vector<engine_op*>, op_less> ready_;
  key_hold* holds_ = nullptr;    // the live holds of many-key ops (key_slot.hpp)
  std::size_t key_waiters_ = 0;  // threads in wait_key
  std::uint16_t max_pipeline_ = 16;
};

}  // namespace kvstore::detail
