// A worker's requests waiting for their answers: each by its request id, with its peer, its
// deadline and what completes it, and how many wait on each server. worker_client
// (client/client.hpp) joins the job and moves frames; this is the table it keeps under its lock.
// Not thread-safe: every call is made with the owner's lock held.
//
// Every one-key op adds a request here on the caller's thread and the io thread takes it when
// the answer comes (issue 12). A node per request (std::unordered_map) was a block that one
// thread allocated and another freed, which glibc's per-thread caches do not serve: both ends
// took malloc's slow path. The requests live instead in entries that are reused, found by id
// in a ring (detail/id_ring.hpp: the ids in flight are nearly consecutive). Up to kept_entries stay
// for reuse when no request waits; a table that held more frees them all then.
#pragma once

#include <kvstore/client/call.hpp>
#include <kvstore/detail/id_ring.hpp>
#include <kvstore/error.hpp>
#include <kvstore/op.hpp>
#include <kvstore/transport/out_frame.hpp>
#include <kvstore/wire/frame.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// One request: the part of an operation it completes, what it is (for messages), and for
/// answers with data either a destination buffer (dense pulls) or a callback.
struct pending_request {
  using clock = std::chrono::steady_clock;
  std::shared_ptr<op_state> done;
  request_label what;
  std::byte* out = nullptr;  // data frames at key element offset o land at out + o * elem
  std::size_t out_bytes = 0;
  std::size_t elem = 0;
  std::function<void(const wire::header&, std::span<const std::byte>)> on_data;
  std::function<void(const wire::header&, std::span<const std::byte>)> on_response;
  /// Sees the text of a successful response (what a server names in it), before on_response.
  std::function<void(std::string_view)> on_text;
  std::chrono::milliseconds timeout{0};
  // set when sent
  std::vector<transport::out_frame> frames;  // kept while a server restart may need a re-send
  int peer = 0;
  clock::time_point deadline;
};

class request_table {
  using clock = pending_request::clock;

 public:
  /// The scheduler's peer number (its requests are not counted per server).
  static constexpr int to_scheduler = -1;

  /// Ids for n requests sent together (consecutive: one frame may answer them all).
  std::uint64_t next_ids(std::size_t n = 1) noexcept {
    const std::uint64_t first = next_id_;
    next_id_ += n;
    return first;
  }

  /// Request `id` to `peer` waits for its answer until its deadline: its own timeout, else
  /// `default_timeout`, from `now`. Returns how many waited on that server before it.
  std::size_t add(std::uint64_t id, int peer, pending_request&& r, clock::time_point now,
                  std::chrono::milliseconds default_timeout) {
    r.peer = peer;
    r.timeout = r.timeout.count() ? r.timeout : default_timeout;
    r.deadline = now + r.timeout;
    entry* e = nullptr;
    if (free_.empty()) {
      e = &entries_.emplace_back();
    } else {
      e = free_.back();
      free_.pop_back();
    }
    e->id = id;
    e->live = true;
    e->r = std::move(r);
    index_.insert(id, e);
    if (peer < 0) return 0;
    if (static_cast<std::size_t>(peer) >= per_server_.size())
      per_server_.resize(static_cast<std::size_t>(peer) + 1, 0);
    return per_server_[static_cast<std::size_t>(peer)]++;
  }

  /// Requests waiting on server `peer`.
  std::size_t in_flight(int peer) const noexcept {
    return peer >= 0 && static_cast<std::size_t>(peer) < per_server_.size()
               ? per_server_[static_cast<std::size_t>(peer)]
               : 0;
  }
  std::size_t size() const noexcept { return index_.size(); }

  /// The request still waiting under `id`, or nullptr (answered, failed, or never sent).
  pending_request* find(std::uint64_t id) {
    entry* e = index_.find(id);
    return e ? &e->r : nullptr;
  }

  /// Removes and returns request `id`, if it still waits.
  std::optional<pending_request> take(std::uint64_t id) {
    entry* e = index_.find(id);
    if (!e) return std::nullopt;
    return take(*e);
  }

  /// Entries kept for requests, waiting or free to reuse: the most that waited at once lately.
  std::size_t entries() const noexcept { return entries_.size(); }
  /// Entries kept for reuse while no request waits (about 250 bytes each); more are freed then.
  static constexpr std::size_t kept_entries = 4096;

  /// Removes those of requests [first, first + n) that still wait (one ok answer to pushes;
  /// some may have failed at their deadline) and returns their ops: an ok answer to pushes needs
  /// nothing else of them, so no whole request is moved. Ids never sent are a peer out of its
  /// mind: a protocol error. The work is bounded by the requests waiting, whatever n says.
  std::vector<std::shared_ptr<op_state>> take_run(std::uint64_t first, std::uint64_t n) {
    if (first == 0 || first > next_id_ || n > next_id_ - first)
      throw error(errc::protocol,
                  "an answer to " + std::to_string(n) + " requests, some of them never sent");
    if (n > index_.size())
      return take_if([&](std::uint64_t id, const pending_request&) { return id - first < n; },
                     [this](entry& e) { return take_op(e); });
    std::vector<std::shared_ptr<op_state>> out;
    out.reserve(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i)
      if (entry* e = index_.find(first + i)) out.push_back(take_op(*e));
    return out;
  }

  /// Removes and returns the requests whose deadline passed by `now`.
  std::vector<pending_request> take_expired(clock::time_point now) {
    return take_if([now](std::uint64_t, const pending_request& r) { return r.deadline <= now; });
  }

  /// Removes and returns the requests waiting on `peer`.
  std::vector<pending_request> take_peer(int peer) {
    return take_if([peer](std::uint64_t, const pending_request& r) { return r.peer == peer; });
  }

  /// Removes and returns every request.
  std::vector<pending_request> take_all() {
    return take_if([](std::uint64_t, const pending_request&) { return true; });
  }

  /// The frames kept for a re-send of the requests waiting on `peer`, oldest first.
  std::vector<std::pair<std::uint64_t, std::vector<transport::out_frame>>> frames_of(int peer) {
    std::vector<std::pair<std::uint64_t, std::vector<transport::out_frame>>> out;
    for (const entry& e : entries_)
      if (e.live && e.r.peer == peer) out.emplace_back(e.id, e.r.frames);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first < b.first; });
    return out;
  }

 private:
  struct entry {
    std::uint64_t id = 0;
    bool live = false;  // a request waits in it (else it is in free_)
    pending_request r;
  };

  // The requests `pred` picks, each removed by `take_one` (take: the whole request; take_op: its
  // op), in the order of the entries.
  template <class Pred, class Take>
  std::vector<std::invoke_result_t<Take&, entry&>> take_if(Pred pred, Take take_one) {
    std::vector<std::invoke_result_t<Take&, entry&>> out;
    // By index: a take that empties the table may drop the entries (release).
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].live && pred(entries_[i].id, entries_[i].r))
        out.push_back(take_one(entries_[i]));
    return out;
  }
  template <class Pred>
  std::vector<pending_request> take_if(Pred pred) {
    return take_if(pred, [this](entry& e) { return take(e); });
  }

  // Removes the request of a live entry and returns it, keeping its server's count; the entry
  // is free to reuse (and all go, if more than kept_entries, once no request waits).
  pending_request take(entry& e) {
    pending_request r = std::move(e.r);
    release(e);
    return r;
  }
  // The same, returning only the request's op.
  std::shared_ptr<op_state> take_op(entry& e) {
    std::shared_ptr<op_state> op = std::move(e.r.done);
    release(e);
    return op;
  }
  // A live entry's request is taken: the entry is freed, its server counted down.
  void release(entry& e) {
    const int peer = e.r.peer;
    if (peer >= 0 && static_cast<std::size_t>(peer) < per_server_.size() &&
        per_server_[static_cast<std::size_t>(peer)])
      --per_server_[static_cast<std::size_t>(peer)];
    e.r = pending_request{};  // what a moved-from request may still hold goes now
    e.live = false;
    index_.erase(e.id);
    if (index_.size() == 0 && entries_.size() > kept_entries) {
      entries_.clear();
      free_.clear();
      index_.clear();
    } else {
      free_.push_back(&e);
    }
  }

  std::deque<entry> entries_;            // never moves one: index_ and free_ point into it
  std::vector<entry*> free_;             // entries no request waits in
  id_ring<entry> index_;                 // the live entries by request id
  std::vector<std::size_t> per_server_;  // requests waiting per server
  std::uint64_t next_id_ = 1;
};

}  // namespace kvstore::detail
