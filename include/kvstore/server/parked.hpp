// Requests a server keeps back, in arrival order, until they may be served: in dist_sync, a
// worker's push or pull of a key that arrives while that worker's push of the key's open round is
// already in. A worker pipelines them (dist_options::pipeline_depth: its next op on a key goes on
// the wire before the previous one is answered), and they must take effect after the round
// completes, in the order they came. Plain bookkeeping, bounded per worker (a count and the
// bytes kept), so a peer pushing one key over and over cannot grow the server. The shard
// (server/shard.hpp) decides when one may be served and serves it.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/wire/frame.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvstore::detail {

/// One request kept back: where its answer goes, the frame, and copies of its text and payload
/// (the connection's buffer is reused for the next frame).
template <class Port>
struct parked_request {
  Port port;
  wire::header h;
  std::string meta;
  std::vector<std::byte> payload;

  std::uint64_t bytes() const noexcept {
    return sizeof(parked_request) + meta.size() + payload.size();
  }
};

template <class Port>
class parked_requests {
 public:
  using request = parked_request<Port>;

  /// How much of one worker may be kept back at once.
  struct limits {
    std::size_t max_requests = 4096;
    std::uint64_t max_bytes = std::uint64_t{64} << 20;
  };

  bool empty() const noexcept { return q_.empty(); }
  /// Whether worker `rank` has requests of `key` kept back.
  bool has(std::uint64_t key, int rank) const { return !q_.empty() && q_.count({key, rank}) != 0; }

  /// Keeps the request of worker `rank` behind its earlier ones of the same key. Throws
  /// invalid_argument, keeping nothing, when the worker is at a limit; `who` names the server.
  void park(int rank, const Port& port, const wire::header& h, std::string_view meta,
            std::span<const std::byte> payload, const limits& lim, const std::string& who) {
    const std::uint64_t cost = sizeof(request) + meta.size() + payload.size();
    auto& use = use_[rank];
    if (use.requests >= lim.max_requests || cost > lim.max_bytes ||
        use.bytes > lim.max_bytes - cost) {
      if (!use.requests) use_.erase(rank);
      throw error(errc::invalid_argument,
                  who + " already keeps " + std::to_string(use.requests) + " requests (" +
                      std::to_string(use.bytes) + " bytes) of worker " + std::to_string(rank) +
                      " back behind open sync rounds, its limit (" + std::to_string(lim.max_bytes) +
                      " bytes, KVSTORE_MAX_QUEUED_BYTES; a lower KVSTORE_PIPELINE_DEPTH sends "
                      "fewer ahead): refused a request of key " +
                      std::to_string(h.key));
    }
    ++use.requests;
    use.bytes += cost;
    q_[{h.key, rank}].push_back(request{port, h, std::string(meta),
                                        std::vector<std::byte>(payload.begin(), payload.end())});
  }

  /// The oldest request of worker `rank` on `key`, taken out; nullopt when none is kept.
  std::optional<request> take_first(std::uint64_t key, int rank) {
    auto it = q_.find({key, rank});
    if (it == q_.end()) return std::nullopt;
    request r = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) q_.erase(it);
    auto u = use_.find(rank);
    --u->second.requests;
    u->second.bytes -= r.bytes();
    if (!u->second.requests) use_.erase(u);
    return r;
  }

  /// The workers with requests of `key` kept back, in rank order.
  std::vector<int> ranks_of(std::uint64_t key) const {
    std::vector<int> out;
    for (auto it = q_.lower_bound({key, std::numeric_limits<int>::min()});
         it != q_.end() && it->first.first == key; ++it)
      out.push_back(it->first.second);
    return out;
  }

  /// The keys with requests kept back.
  std::vector<std::uint64_t> keys() const {
    std::vector<std::uint64_t> out;
    for (auto& entry : q_)
      if (out.empty() || out.back() != entry.first.first) out.push_back(entry.first.first);
    return out;
  }

  /// Drops every request of worker `rank` (its connection is gone: no answer can reach it).
  void drop_worker(int rank) {
    if (!use_.count(rank)) return;
    for (auto it = q_.begin(); it != q_.end();)
      it = it->first.second == rank ? q_.erase(it) : std::next(it);
    use_.erase(rank);
  }

  void clear() {
    q_.clear();
    use_.clear();
  }

 private:
  struct usage {
    std::size_t requests = 0;
    std::uint64_t bytes = 0;
  };
  std::map<std::pair<std::uint64_t, int>, std::deque<request>> q_;  // by key, then worker
  std::unordered_map<int, usage> use_;
};

}  // namespace kvstore::detail
