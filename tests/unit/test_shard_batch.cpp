// The shard's batched frames (server/batch.hpp): many small keys' inits, pushes and pulls in one
// frame each, answered once per request; checked whole before anything changes; sharing rounds,
// versions, exactly-once and membership with one-key requests.
#include <kvstore/server/batch.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include "support/shard_fixture.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace kvtest_shard;

namespace {

/// One key of a batched frame: its id, value (or, for a pull, as many elements as it asks) and
/// the entry's aux (push number, row length).
struct bkey {
  std::uint64_t key;
  std::vector<float> value;
  std::uint64_t aux = 0;
};

/// Sends a batched frame of `c` from `rank` naming `ks` (with their values as the payload when
/// `data`); returns its request id. Throws as the shard does.
std::uint64_t send(fixture& f, int rank, wire::cmd c, const std::vector<bkey>& ks, bool data = true,
                   bool each = false) {
  std::string meta(ks.size() * wire::batch_entry_size, '\0');
  std::vector<float> payload;
  std::uint64_t elements = 0;
  for (std::size_t i = 0; i < ks.size(); ++i) {
    wire::put_batch_entry(meta.data() + i * wire::batch_entry_size,
                          {ks[i].key, ks[i].value.size(), ks[i].aux});
    elements += ks[i].value.size();
    if (data) payload.insert(payload.end(), ks[i].value.begin(), ks[i].value.end());
  }
  wire::header h = wire::batch_header(c, wire::dtype::f32, ks.size(), elements, 0,
                                      c == wire::cmd::batch_init && data, each);
  h.req_id = ++f.req;
  if (each) f.req += ks.size() - 1;  // key i answered by req_id + i
  h.payload_len = payload.size() * sizeof(float);
  f.sh.handle(rank, f.port(rank), h, meta, bytes_of(payload));
  return h.req_id;
}

/// How many requests `got` answers: pushes' acks (wire::acks_header) may answer several at once.
std::size_t answered(const std::vector<answer>& got) {
  std::size_t n = 0;
  for (auto& a : got) n += wire::is_acks(a.h) ? static_cast<std::size_t>(a.h.aux) : 1;
  return n;
}

/// A batched pull's answer: its data frames (flagged flag_batch, offsets counted from the first
/// key's first element), put together.
std::vector<float> pulled(fixture& f, const std::vector<bkey>& ks, int rank = 0) {
  auto& g = f.got(rank);
  g.clear();
  const std::uint64_t id = send(f, rank, wire::cmd::batch_pull, ks, false);
  std::vector<float> out;
  for (std::size_t i = 0; i < g.size(); ++i) {
    REQUIRE(g[i].data);
    CHECK(g[i].h.req_id == id);
    CHECK((g[i].h.flags & wire::flag_batch) != 0);
    CHECK(g[i].h.offset == out.size());
    CHECK(((g[i].h.flags & wire::flag_last) != 0) == (i + 1 == g.size()));
    out.insert(out.end(), g[i].values.begin(), g[i].values.end());
  }
  g.clear();
  return out;
}

template <class F>
errc refused(F&& f) {
  return error_of(std::forward<F>(f));
}

/// The threads an optimizer's updates ran on. With `wait_for_second` the first thread's first
/// update waits (5 s at most) until another thread updates too: threads woken late could
/// otherwise leave every run to the first one, and the test would depend on timing.
struct thread_log {
  std::mutex m;
  std::condition_variable second;
  std::set<std::thread::id> seen;
  bool wait_for_second = false;
  void note() {
    std::unique_lock lk(m);
    seen.insert(std::this_thread::get_id());
    if (seen.size() > 1) second.notify_all();
    if (wait_for_second) {
      wait_for_second = false;
      second.wait_for(lk, std::chrono::seconds(5), [&] { return seen.size() > 1; });
    }
  }
  /// Starts a new log.
  void reset(bool wait) {
    std::lock_guard lk(m);
    seen.clear();
    wait_for_second = wait;
  }
  std::size_t count() {
    std::lock_guard lk(m);
    return seen.size();
  }
};
thread_log& update_threads() {
  static thread_log log;
  return log;
}

/// An element-wise optimizer, w += 2 g, that notes the thread each update runs on.
struct thread_probe {
  static constexpr std::string_view name = "test_shard_batch_thread_probe";
  static constexpr int num_slots = 0;
  static constexpr bool elementwise = true;
  template <class T>
  void update(std::span<const T> grad, std::span<T> weight,
              const kvstore::optim::slots_view<T>&) const {
    for (std::size_t i = 0; i < weight.size(); ++i) weight[i] += 2 * grad[i];
    update_threads().note();
  }
  template <class Ar>
  void serialize(Ar&, unsigned) {}
};

/// `n` keys from 1 (every 97th of 3 elements, the others of 1), valued value(key, element),
/// pushed as push number `seq`.
template <class Value>
std::vector<bkey> many_keys(std::uint64_t n, std::uint64_t seq, Value&& value) {
  std::vector<bkey> ks;
  for (std::uint64_t k = 1; k <= n; ++k) {
    bkey b{k, std::vector<float>(k % 97 == 0 ? 3 : 1), seq};
    for (std::size_t e = 0; e < b.value.size(); ++e) b.value[e] = value(k, e);
    ks.push_back(std::move(b));
  }
  return ks;
}

}  // namespace

TEST_CASE("a slice's fields a batched push reads lie in the lines its pass prefetches") {
  using slice = kvstore::detail::key_slice<box_port>;
  using kvstore::detail::slice_hot_bytes;
  using kvstore::detail::slice_lone_push_bytes;
  // With the node's 8-byte key: a lone push's bytes are two whole lines, a round's within four.
  CHECK(slice_lone_push_bytes + 8 == 128);
  CHECK(slice_hot_bytes + 8 <= 4 * 64);
  kvstore::detail::key_map<slice> slices;
  for (std::uint64_t k = 0; k < 40; ++k) {  // slots in two slabs, at every stride offset
    slice& s = slices.try_emplace(k).first->second;
    const auto at = reinterpret_cast<std::uintptr_t>(&s);
    CHECK(at % 64 == 8);  // after the node's key, in a node that starts a line
    // What batch_ops::push reads of a slice when alone: inside slice_lone_push_bytes.
    auto inside = [&](const auto& field, std::size_t bytes,
                      std::size_t prefetched = slice_lone_push_bytes) {
      const auto f = reinterpret_cast<std::uintptr_t>(&field);
      return f >= at && f + bytes <= at + prefetched;
    };
    CHECK(inside(s.lo, sizeof s.lo));
    CHECK(inside(s.hi, sizeof s.hi));
    CHECK(inside(s.round, sizeof s.round));
    CHECK(inside(s.value, sizeof s.value));
    CHECK(inside(s.cov, sizeof s.cov));
    CHECK(inside(s.applied, sizeof(std::uint64_t)));
    // ... where applied keeps rank 0's number: its first 8 bytes.
    s.applied.set(0, 0x1234'5678'9abcULL);
    std::uint64_t first = 0;
    std::memcpy(&first, &s.applied, sizeof first);
    CHECK(first == 0x1234'5678'9abcULL);
    // What a push of several workers reads besides (its round): inside slice_hot_bytes.
    CHECK(inside(s.round_done, sizeof s.round_done, slice_hot_bytes));
    CHECK(inside(s.merge, sizeof s.merge, slice_hot_bytes));
    CHECK(inside(s.round_waiters, sizeof s.round_waiters, slice_hot_bytes));
    CHECK(inside(s.round_seq, sizeof s.round_seq, slice_hot_bytes));
    CHECK(inside(s.batch_stamp, sizeof s.batch_stamp, slice_hot_bytes));
  }
}

TEST_CASE("batched init, push and pull: one answer each, values in the entries' order" *
          doctest::timeout(10)) {
  fixture f(1, true, 8);  // answers in frames of 2 floats
  const auto init = send(f, 0, wire::cmd::batch_init, {{1, {1}}, {2, {2, 3}}, {4, {4}}});
  REQUIRE(responses(f, 0, init).size() == 1);
  CHECK(f.changes == std::vector<bool>{true});  // one report for the frame, before its answer
  CHECK(f.sh.slices().size() == 3);
  const auto push =
      send(f, 0, wire::cmd::batch_push, {{1, {10}, 1}, {2, {20, 30}, 1}, {4, {40}, 1}});
  auto r = responses(f, 0, push);
  REQUIRE(r.size() == 1);
  CHECK(r[0].status == errc::ok);
  CHECK(f.counts.back() == 3);  // three rounds completed: one report
  CHECK(pulled(f, {{4, {0}}, {1, {0}}, {2, {0, 0}}}) == std::vector<float>{40, 10, 20, 30});
  // The keys are the one-key path's too: pulled, pushed and counted alike.
  CHECK(f.pull(2, 2) == std::vector<float>{20, 30});
  CHECK(f.version(2, 2) == 1);
  f.push(0, 2, {5, 6}, 0, 2, 2);
  CHECK(f.got(0).back().status == errc::ok);
  CHECK(pulled(f, {{2, {0, 0}}}) == std::vector<float>{5, 6});
  CHECK(f.version(2, 2) == 2);
  CHECK(f.version(4, 1) == 1);
}

TEST_CASE(
    "dist_sync, two workers: answered once every key's round completed; one-key and "
    "batched pushes share rounds" *
    doctest::timeout(10)) {
  fixture f(2);
  for (std::uint64_t k : {1, 2, 4}) f.init_all(k, {0}, 0, 1, 1);
  const auto b0 = send(f, 0, wire::cmd::batch_push, {{1, {1}, 1}, {2, {2}, 1}, {4, {4}, 1}});
  CHECK(responses(f, 0, b0).empty());
  f.push(1, 1, {10}, 0, 1, 1);
  f.push(1, 2, {20}, 0, 1, 1);
  CHECK(f.got(1).size() == 2);         // worker 1's rounds of keys 1 and 2 completed
  CHECK(responses(f, 0, b0).empty());  // worker 0 still waits for key 4
  const auto b1 = send(f, 1, wire::cmd::batch_push, {{4, {40}, 1}});
  CHECK(responses(f, 0, b0).size() == 1);
  CHECK(responses(f, 1, b1).size() == 1);
  CHECK(pulled(f, {{1, {0}}, {2, {0}}, {4, {0}}}) == std::vector<float>{11, 22, 44});
  // The same worker twice in a round: the second frame breaks the protocol.
  send(f, 0, wire::cmd::batch_push, {{1, {1}, 2}});
  CHECK(refused([&] { send(f, 0, wire::cmd::batch_push, {{1, {1}, 3}}); }) == errc::protocol);
}

TEST_CASE(
    "dist_sync, three workers: exact sums of whole small values (copied, then added, inline) "
    "and of values past that size or pushed in parts" *
    doctest::timeout(10)) {
  fixture f(3);
  // 64 elements: the inline path's largest; 65: the general one.
  const std::vector<std::uint64_t> sizes{1, 64, 65};
  for (std::uint64_t k = 0; k < sizes.size(); ++k)
    f.init_all(k + 1, std::vector<float>(sizes[k], 0), 0, sizes[k], sizes[k]);
  auto value = [](int rank, std::uint64_t k, std::size_t e) {
    return static_cast<float>((rank + 1) * 1000 + k * 100 + e) * 0.25f;
  };
  auto keys_of = [&](int rank, std::uint64_t seq) {
    std::vector<bkey> ks;
    for (std::uint64_t k = 0; k < sizes.size(); ++k) {
      bkey b{k + 1, std::vector<float>(sizes[k]), seq};
      for (std::size_t e = 0; e < b.value.size(); ++e) b.value[e] = value(rank, k, e);
      ks.push_back(std::move(b));
    }
    return ks;
  };
  for (int r = 0; r < 3; ++r) send(f, r, wire::cmd::batch_push, keys_of(r, 1));
  std::vector<float> want;
  for (std::uint64_t k = 0; k < sizes.size(); ++k)
    for (std::size_t e = 0; e < sizes[k]; ++e)
      want.push_back(value(0, k, e) + value(1, k, e) + value(2, k, e));
  std::vector<bkey> ask;
  for (std::uint64_t k = 0; k < sizes.size(); ++k)
    ask.push_back({k + 1, std::vector<float>(sizes[k])});
  CHECK(pulled(f, ask) == want);
  // Round 2 of key 2 (64 elements): worker 0 whole, worker 1 in two parts, worker 2 whole. The
  // parts meet a round the inline path began, and the last whole push adds to both.
  std::vector<float> w0(64, 1.5f), w2(64, 4.0f), first(40, 2.0f), rest(24, 3.0f);
  f.push(0, 2, w0, 0, 64, 2);
  f.push(1, 2, first, 0, 64, 2, false);
  f.push(1, 2, rest, 40, 64, 2, true);
  f.push(2, 2, w2, 0, 64, 2);
  std::vector<float> want2(64);
  for (std::size_t e = 0; e < 64; ++e) want2[e] = 1.5f + (e < 40 ? 2.0f : 3.0f) + 4.0f;
  CHECK(f.pull(2, 64) == want2);
  CHECK(f.version(2, 64) == 2);
}

TEST_CASE(
    "exactly once: a batched push re-sent after a restart applies what the snapshot "
    "lacks" *
    doctest::timeout(10)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    fixture a(1, sync);
    send(a, 0, wire::cmd::batch_init, {{1, {1}}, {2, {2}}});
    a.got(0).clear();
    a.set_optimizer("add", params_of(optim::add{}));
    send(a, 0, wire::cmd::batch_push, {{1, {1}, 1}, {2, {1}, 1}});
    const auto file = wire::encode_snapshot(kvstore::detail::take_snapshot(a.sh, 0));
    fixture b(1, sync);
    kvstore::detail::restore_snapshot(b.sh, wire::decode_snapshot(file, "test"), 1);
    // Re-sent: key 1's push 1 is in the snapshot, key 2's push 2 is new.
    const auto again = send(b, 0, wire::cmd::batch_push, {{1, {1}, 1}, {2, {1}, 2}});
    auto r = responses(b, 0, again);
    REQUIRE(r.size() == 1);
    CHECK(r[0].status == errc::ok);
    CHECK(pulled(b, {{1, {0}}, {2, {0}}}) == std::vector<float>{2, 4});
    CHECK(b.version(1, 1) == 1);
    CHECK(b.version(2, 1) == 2);
    // A restored init re-sent is answered, not refused.
    CHECK(responses(b, 0, send(b, 0, wire::cmd::batch_init, {{1, {9}}})).size() == 1);
    CHECK(pulled(b, {{1, {0}}}) == std::vector<float>{2});
  }
}

TEST_CASE("a batched frame is checked whole: a bad key refuses it, and nothing changes" *
          doctest::timeout(10)) {
  kvstore::detail::shard_config c = fixture::config(1, true, 1 << 20);
  c.max_frame_bytes = 64;
  fixture f(c);
  send(f, 0, wire::cmd::batch_init, {{1, {1}}, {2, {2}}});
  f.init(0, 3, {1, 2}, 0, 2, 4);  // key 3: elements [0, 2) of 4 here
  f.got(0).clear();
  const std::size_t reports = f.changes.size();
  auto unchanged = [&] {
    CHECK(pulled(f, {{1, {0}}, {2, {0}}}) == std::vector<float>{1, 2});
    CHECK(f.version(1, 1) == 0);
    CHECK(f.version(2, 1) == 0);
    CHECK(f.changes.size() == reports);
    CHECK(f.sh.slices().size() == 3);
  };
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_push, {{1, {5}, 1}, {9, {5}, 1}});
        }) == errc::unknown_key);
  unchanged();
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_push, {{1, {5}, 1}, {2, {5, 5}, 1}});
        }) == errc::size_mismatch);
  unchanged();
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_push, {{2, {5}, 1}, {2, {6}, 2}});
        }) == errc::protocol);
  unchanged();
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_pull, {{1, {0}}, {3, {0, 0, 0, 0}}}, false);
        }) == errc::size_mismatch);  // key 3 is not whole here
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_pull, {{1, {0, 0}}}, false);
        }) == errc::size_mismatch);
  CHECK(
      refused([&] {
        send(f, 0, wire::cmd::batch_pull, {{1, {0}}, {2, {0}}, {7, std::vector<float>(30)}}, false);
      }) == errc::invalid_argument);  // 32 floats: past max_frame_bytes in one answer
  // A payload that is not the entries' values, or entries that do not match the header.
  {
    std::string meta(wire::batch_entry_size, '\0');
    wire::put_batch_entry(meta.data(), {1, 1, 1});
    wire::header h = wire::batch_header(wire::cmd::batch_push, wire::dtype::f32, 1, 1, 0);
    const std::vector<float> two{1, 2};
    CHECK(refused([&] { f.sh.handle(0, f.port(0), h, meta, bytes_of(two)); }) == errc::protocol);
    h.key = 2;
    CHECK(refused([&] { f.sh.handle(0, f.port(0), h, meta, bytes_of({1})); }) == errc::protocol);
    h.key = 1;
    h.total = 3;
    CHECK(refused([&] { f.sh.handle(0, f.port(0), h, meta, bytes_of({1})); }) == errc::protocol);
    // A header naming a billion keys over 24 bytes of entries: refused before any is read.
    h.key = 1'000'000'000;
    h.total = 1;
    CHECK(refused([&] { f.sh.handle(0, f.port(0), h, meta, bytes_of({1})); }) == errc::protocol);
    // The sink takes what max_frame_bytes allows, no more.
    h.key = 1;
    h.payload_len = 65;
    CHECK(refused([&] { f.sh.sink(0, h); }) == errc::protocol);
  }
  unchanged();
  // A worker that left pushes no more.
  f.sh.worker_left(0);
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_push, {{1, {5}, 1}});
        }) == errc::invalid_argument);
}

TEST_CASE(
    "batched inits: others wait for rank 0's values; a key taken, named twice or past "
    "max_keys refuses the frame before anything is made" *
    doctest::timeout(10)) {
  kvstore::detail::shard_config c = fixture::config(2, true, 1 << 20);
  c.max_keys = 4;
  fixture f(c);
  const auto r1 = send(f, 1, wire::cmd::batch_init, {{1, {0}}, {2, {0, 0}}}, false);
  CHECK(responses(f, 1, r1).empty());
  CHECK(f.sh.slices().size() == 2);  // made, not inited: a pull of them is unknown
  CHECK(refused([&] { f.pull(1, 1); }) == errc::unknown_key);
  const auto r0 = send(f, 0, wire::cmd::batch_init, {{2, {5, 6}}, {1, {7}}});
  CHECK(responses(f, 0, r0).size() == 1);
  CHECK(responses(f, 1, r1).size() == 1);
  CHECK(pulled(f, {{1, {0}}, {2, {0, 0}}}) == std::vector<float>{7, 5, 6});
  // Refused whole: nothing made, no slot taken.
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_init, {{3, {1}}, {1, {1}}});
        }) == errc::already_inited);
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_init, {{3, {1}}, {3, {1}}});
        }) == errc::protocol);
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_init, {{3, {1}}, {5, {1}}, {6, {1}}});
        }) == errc::invalid_argument);  // 5 keys: past max_keys
  CHECK(refused([&] {
          send(f, 0, wire::cmd::batch_init, {{3, {1}}, {1, {1, 1}}});
        }) == errc::size_mismatch);
  CHECK(f.sh.slices().size() == 2);
  CHECK(responses(f, 0, send(f, 0, wire::cmd::batch_init, {{3, {1}}, {5, {2}}})).size() == 1);
  CHECK(f.sh.slices().size() == 4);
}

TEST_CASE("a batched frame's changes are reported once, before any of its answers" *
          doctest::timeout(10)) {
  fixture f(2);
  for (std::uint64_t k = 1; k <= 5; ++k) f.init_all(k, {0}, 0, 1, 1);
  std::size_t answered_at_report = 99;
  f.on_change = [&] { answered_at_report = f.got(0).size() + f.got(1).size(); };
  // Worker 1's one-key pushes of keys 1 and 2 and its batch of key 3 wait for worker 0.
  f.push(1, 1, {1}, 0, 1, 1);
  f.push(1, 2, {1}, 0, 1, 1);
  send(f, 1, wire::cmd::batch_push, {{3, {1}, 1}});
  CHECK(f.got(1).empty());
  f.counts.clear();
  const auto id =
      send(f, 0, wire::cmd::batch_push, {{1, {2}, 1}, {2, {2}, 1}, {3, {2}, 1}, {4, {2}, 1}});
  CHECK(f.counts == std::vector<std::uint64_t>{3});  // keys 1-3 done; 4 waits for worker 1
  CHECK(answered_at_report == 0);                    // the report came first
  CHECK(answered(f.got(1)) == 3);                    // worker 1's pushes and its batch
  CHECK(responses(f, 0, id).empty());                // worker 0 waits for key 4's round
  send(f, 1, wire::cmd::batch_push, {{4, {1}, 1}, {5, {1}, 1}});
  CHECK(responses(f, 0, id).size() == 1);
  CHECK(pulled(f, {{1, {0}}, {4, {0}}, {5, {0}}}) == std::vector<float>{3, 3, 0});  // 5 waits
}

TEST_CASE("a worker's death fails the batched request waiting on its rounds, once" *
          doctest::timeout(10)) {
  fixture f(2);
  for (std::uint64_t k : {1, 2}) f.init_all(k, {0}, 0, 1, 1);
  const auto id = send(f, 0, wire::cmd::batch_push, {{1, {1}, 1}, {2, {1}, 1}});
  f.sh.worker_dead(1, "worker 1 (node 11) died");
  auto r = responses(f, 0, id);
  REQUIRE(r.size() == 1);
  CHECK(r[0].status == errc::node_dead);
  CHECK(r[0].message.find("worker 1") != std::string::npos);
  // A batched init waiting for rank 0's value fails when rank 0 dies.
  fixture g(2);
  const auto w = send(g, 1, wire::cmd::batch_init, {{1, {0}}, {2, {0}}}, false);
  g.sh.worker_dead(0, "worker 0 died");
  auto gr = responses(g, 1, w);
  REQUIRE(gr.size() == 1);
  CHECK(gr[0].status == errc::node_dead);
}

TEST_CASE("a batched pull never waits: under bounded staleness one that would is unsupported" *
          doctest::timeout(10)) {
  kvstore::detail::shard_config c = fixture::config(2, false, 1 << 20);
  c.staleness = 0;
  fixture f(c);
  send(f, 0, wire::cmd::batch_init, {{1, {0}}, {2, {0}}});
  send(f, 1, wire::cmd::batch_init, {{1, {0}}, {2, {0}}}, false);
  f.got(0).clear();
  CHECK(pulled(f, {{1, {0}}, {2, {0}}}) == std::vector<float>{0, 0});  // nobody ahead
  send(f, 0, wire::cmd::batch_push, {{1, {3}, 1}, {2, {4}, 1}});
  CHECK(refused([&] { pulled(f, {{1, {0}}, {2, {0}}}); }) == errc::unsupported);
  send(f, 1, wire::cmd::batch_push, {{1, {5}, 1}, {2, {6}, 1}});
  CHECK(pulled(f, {{1, {0}}, {2, {0}}}) == std::vector<float>{5, 6});  // async: the last push
}

TEST_CASE(
    "flag_each (fused one-key pushes): each key answered on its own, as its round completes; a "
    "refused frame answers every key" *
    doctest::timeout(10)) {
  SUBCASE("dist_sync, two workers") {
    fixture f(2);
    for (std::uint64_t k : {1, 2, 4}) f.init_all(k, {0}, 0, 1, 1);
    const auto b0 =
        send(f, 0, wire::cmd::batch_push, {{1, {1}, 1}, {2, {2}, 1}, {4, {4}, 1}}, true, true);
    CHECK(f.got(0).empty());
    f.push(1, 2, {20}, 0, 1, 1);  // key 2's round completes: only its answer goes
    REQUIRE(responses(f, 0, b0 + 1).size() == 1);
    CHECK(f.got(0).empty());
    f.push(1, 1, {10}, 0, 1, 1);
    auto r = responses(f, 0, b0);
    REQUIRE(r.size() == 1);
    CHECK(r[0].status == errc::ok);
    CHECK(responses(f, 0, b0 + 2).empty());  // key 4 still waits for worker 1
    f.push(1, 4, {40}, 0, 1, 1);
    CHECK(responses(f, 0, b0 + 2).size() == 1);
    CHECK(f.got(0).empty());  // no answer for the frame as a whole
    f.got(1).clear();         // worker 1's one-key answers
    // Worker 1's fused frame completes all three of worker 0's rounds while it is served: one
    // response answers worker 0's three keys, one worker 1's.
    const auto c0 =
        send(f, 0, wire::cmd::batch_push, {{1, {1}, 2}, {2, {2}, 2}, {4, {4}, 2}}, true, true);
    const auto c1 =
        send(f, 1, wire::cmd::batch_push, {{1, {1}, 2}, {2, {2}, 2}, {4, {4}, 2}}, true, true);
    for (auto [rank, id] : {std::pair{0, c0}, std::pair{1, c1}}) {
      auto r = responses(f, rank, id);
      REQUIRE(r.size() == 1);
      CHECK(r[0].h.aux == 3);
      CHECK((r[0].h.flags & wire::flag_each) != 0);
      CHECK(f.got(rank).empty());
    }
    CHECK(pulled(f, {{1, {0}}, {2, {0}}, {4, {0}}}) ==
          std::vector<float>{2, 4, 8});  // round 2's sums
  }
  SUBCASE("dist_async: every key answered at once, applied in order") {
    fixture f(2, false);
    for (std::uint64_t k : {1, 2}) f.init_all(k, {0}, 0, 1, 1);
    const auto b = send(f, 0, wire::cmd::batch_push, {{1, {5}, 1}, {2, {6}, 1}}, true, true);
    // Both answered while the frame was served: one response for the two (aux: how many).
    auto r = responses(f, 0, b);
    REQUIRE(r.size() == 1);
    CHECK(r[0].status == errc::ok);
    CHECK((r[0].h.flags & wire::flag_each) != 0);
    CHECK(r[0].h.aux == 2);
    CHECK(f.got(0).empty());
    CHECK(pulled(f, {{1, {0}}, {2, {0}}}) == std::vector<float>{5, 6});
  }
  SUBCASE("an unknown key refuses the frame: each key's push gets the error, nothing changes") {
    fixture f(1);
    f.init_all(1, {3}, 0, 1, 1);
    const auto b = send(f, 0, wire::cmd::batch_push, {{1, {1}, 1}, {99, {2}, 1}}, true, true);
    for (std::uint64_t i = 0; i < 2; ++i) {
      auto r = responses(f, 0, b + i);
      REQUIRE(r.size() == 1);
      CHECK(r[0].status == errc::unknown_key);
      CHECK(r[0].message.find("99") != std::string::npos);
    }
    CHECK(pulled(f, {{1, {0}}}) == std::vector<float>{3});
  }
  SUBCASE("request ids that would wrap are a protocol error") {
    fixture f(1);
    f.init_all(1, {0}, 0, 1, 1);
    f.init_all(2, {0}, 0, 1, 1);
    f.req = ~std::uint64_t{0} - 1;  // the frame's id is the last one: key 1 would wrap
    CHECK(refused([&] {
            send(f, 0, wire::cmd::batch_push, {{1, {1}, 1}, {2, {1}, 1}}, true, true);
          }) == errc::protocol);
  }
}

namespace {

/// Keys 1..64 of one float each (key 10: two), as a batched frame: enough keys to be planned
/// (frame_plans::min_keys), each valued `v` and numbered `seq` (the entries' aux).
std::vector<bkey> plannable(float v = 0, std::uint64_t seq = 0) {
  std::vector<bkey> ks;
  for (std::uint64_t k = 1; k <= 64; ++k)
    ks.push_back({k, std::vector<float>(k == 10 ? 2 : 1, v), seq});
  return ks;
}

/// A pull's answer of plannable(): every element `v`.
std::vector<float> all(float v) { return std::vector<float>(65, v); }

}  // namespace

TEST_CASE(
    "frames seen before follow their plan, and every check still applies: sizes, keys named "
    "twice, unknown keys, one push per round" *
    doctest::timeout(10)) {
  static_assert(kvstore::detail::frame_plans<int>::min_keys <= 64);
  fixture f(2);
  f.set_optimizer("add", params_of(optim::add{}));
  send(f, 0, wire::cmd::batch_init, plannable());
  send(f, 1, wire::cmd::batch_init, plannable(), false);
  // Three steps: the frames are planned at the second, followed at the third.
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {
    const auto a = send(f, 0, wire::cmd::batch_push, plannable(1, seq));
    const auto b = send(f, 1, wire::cmd::batch_push, plannable(2, seq));
    CHECK(responses(f, 0, a).size() == 1);
    CHECK(responses(f, 1, b).size() == 1);
    CHECK(pulled(f, plannable()) == all(3 * static_cast<float>(seq)));
  }
  // Frames of the same signature (length, first, middle and last key) that differ elsewhere.
  auto changed = [](std::size_t at, std::uint64_t key, std::size_t elements) {
    auto ks = plannable(1, 4);
    ks[at].key = key;
    ks[at].value.assign(elements, 1);
    return ks;
  };
  CHECK(refused([&] { send(f, 0, wire::cmd::batch_push, changed(9, 10, 1)); }) ==
        errc::size_mismatch);
  CHECK(refused([&] { send(f, 0, wire::cmd::batch_push, changed(20, 22, 1)); }) ==
        errc::protocol);  // key 22 named twice
  CHECK(refused([&] { send(f, 0, wire::cmd::batch_push, changed(20, 999, 1)); }) ==
        errc::unknown_key);
  auto pull_changed = changed(9, 10, 3);
  CHECK(refused([&] { pulled(f, pull_changed); }) == errc::size_mismatch);
  CHECK(pulled(f, plannable()) == all(9));  // nothing changed
  // Worker 0 twice in one round, on a planned frame: the protocol is broken.
  const auto a = send(f, 0, wire::cmd::batch_push, plannable(1, 4));
  CHECK(refused([&] { send(f, 0, wire::cmd::batch_push, plannable(1, 5)); }) == errc::protocol);
  const auto b = send(f, 1, wire::cmd::batch_push, plannable(2, 4));
  CHECK(responses(f, 0, a).size() == 1);
  CHECK(responses(f, 1, b).size() == 1);
  CHECK(pulled(f, plannable()) == all(12));
  // A different frame still works, and a changed one does not spoil the plan of the first.
  CHECK(pulled(f, {{1, {0}}, {2, {0}}}) == std::vector<float>{12, 12});
  CHECK(pulled(f, plannable()) == all(12));
}

TEST_CASE("a planned frame never reaches freed slices: a restore replaces them" *
          doctest::timeout(10)) {
  for (bool sync : {true, false}) {
    CAPTURE(sync);
    fixture f(1, sync);
    f.set_optimizer("add", params_of(optim::add{}));
    send(f, 0, wire::cmd::batch_init, plannable(1));
    for (std::uint64_t seq = 1; seq <= 2; ++seq) {
      send(f, 0, wire::cmd::batch_push, plannable(1, seq));
      CHECK(pulled(f, plannable()) == all(1 + static_cast<float>(seq)));
    }
    const auto snap = kvstore::detail::take_snapshot(f.sh, 0);  // every key 3
    for (std::uint64_t seq = 3; seq <= 4; ++seq) {
      send(f, 0, wire::cmd::batch_push, plannable(1, seq));
      CHECK(pulled(f, plannable()) == all(1 + static_cast<float>(seq)));
    }
    kvstore::detail::restore_snapshot(f.sh, snap, 1);
    CHECK(pulled(f, plannable()) == all(3));
    send(f, 0, wire::cmd::batch_push, plannable(1, 5));
    CHECK(pulled(f, plannable()) == all(4));
    CHECK(pulled(f, plannable()) == all(4));
  }
}

namespace {

/// Checks that the shard's count of worker r's pushes in open rounds is what its slices hold.
void open_pushes_exact(fixture& f, int workers) {
  for (int r = 0; r < workers; ++r) {
    std::int64_t open = 0;
    for (const auto& entry : f.sh.slices()) open += entry.second.round_done.count(r) ? 1 : 0;
    CAPTURE(r);
    CHECK(f.sh.open_pushes(r) == open);
  }
}

}  // namespace

TEST_CASE(
    "a worker's pushes in open rounds are counted exactly, so a planned frame that reads no "
    "slice is one that no check could refuse" *
    doctest::timeout(10)) {
  fixture f(3);
  f.set_optimizer("add", params_of(optim::add{}));
  send(f, 0, wire::cmd::batch_init, plannable());
  for (int r : {1, 2}) send(f, r, wire::cmd::batch_init, plannable(), false);
  for (int r = 0; r < 3; ++r) f.got(r).clear();
  open_pushes_exact(f, 3);
  float sum = 0;
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {  // planned at the second, followed at the third
    send(f, 0, wire::cmd::batch_push, plannable(1, seq));
    CHECK(f.sh.open_pushes(0) == 64);
    open_pushes_exact(f, 3);
    send(f, 1, wire::cmd::batch_push, plannable(2, seq));
    open_pushes_exact(f, 3);
    if (seq == 1) {  // worker 2 one key at a time (the one-key path counts the same)
      for (const auto& k : plannable(3, seq)) f.push(2, k.key, k.value, 0, k.value.size(), seq);
    } else {
      send(f, 2, wire::cmd::batch_push, plannable(3, seq));
    }
    sum += 6;
    for (int r = 0; r < 3; ++r) CHECK(f.sh.open_pushes(r) == 0);  // every round completed
    CHECK(pulled(f, plannable()) == all(sum));
  }
  // One key of worker 0 open: its planned frame naming that key again is refused whole.
  f.push(0, 5, {100}, 0, 1, 4);
  CHECK(f.sh.open_pushes(0) == 1);
  CHECK(refused([&] { send(f, 0, wire::cmd::batch_push, plannable(1, 4)); }) == errc::protocol);
  CHECK(f.sh.open_pushes(0) == 1);  // not one key of the refused frame went into its round
  open_pushes_exact(f, 3);
  CHECK(f.version(1, 1) == 3);  // nothing of the refused frame was applied
  // A worker that leaves completes the rounds that waited only for it.
  send(f, 1, wire::cmd::batch_push, {{5, {100}, 4}});
  f.sh.worker_left(2);
  for (int r = 0; r < 3; ++r) CHECK(f.sh.open_pushes(r) == 0);
  CHECK(pulled(f, {{5, {0}}}) == std::vector<float>{sum + 200});
  // A worker that dies fails the rounds that wait for it.
  send(f, 0, wire::cmd::batch_push, plannable(1, 5));
  CHECK(f.sh.open_pushes(0) == 64);
  f.sh.worker_dead(1, "worker 1 died");
  open_pushes_exact(f, 3);
  CHECK(f.sh.open_pushes(0) == 0);
  // A restore replaces the slices, open rounds and all.
  fixture g(2);
  send(g, 0, wire::cmd::batch_init, plannable());
  send(g, 1, wire::cmd::batch_init, plannable(), false);
  const auto snap = kvstore::detail::take_snapshot(g.sh, 0);
  send(g, 0, wire::cmd::batch_push, plannable(1, 1));
  CHECK(g.sh.open_pushes(0) == 64);
  kvstore::detail::restore_snapshot(g.sh, snap, 1);
  open_pushes_exact(g, 2);
  CHECK(g.sh.open_pushes(0) == 0);
}

TEST_CASE("a planned batched pull under bounded staleness still checks every key" *
          doctest::timeout(10)) {
  kvstore::detail::shard_config c = fixture::config(2, false, 1 << 20);
  c.staleness = 0;
  fixture f(c);
  send(f, 0, wire::cmd::batch_init, plannable());
  send(f, 1, wire::cmd::batch_init, plannable(), false);
  f.got(0).clear();
  for (int i = 0; i < 3; ++i) CHECK(pulled(f, plannable()) == all(0));  // planned, followed
  send(f, 0, wire::cmd::batch_push, {{33, {3}, 1}});  // worker 0 one push ahead on key 33
  CHECK(refused([&] { pulled(f, plannable()); }) == errc::unsupported);
  send(f, 1, wire::cmd::batch_push, {{33, {5}, 1}});
  auto want = all(0);
  want[33] = 5;  // key 33's element (key 10 has two before it)
  CHECK(pulled(f, plannable()) == want);
}

TEST_CASE(
    "a batched push of many keys is served on the apply pool's threads: the same values, rounds, "
    "changes and answers as on the io thread alone" *
    doctest::timeout(60)) {
  kvstore::optim::register_optimizer<thread_probe>();
  const std::uint64_t n = 3000;  // over twice batch_ops' parallel_batch_keys: the pool's
  auto zeros = many_keys(n, 0, [](std::uint64_t, std::size_t) { return 0.0f; });
  auto init = many_keys(n, 0, [](std::uint64_t k, std::size_t e) { return float(k + e); });
  // threads: 1 (the io thread alone), then 4 (a pool of four).
  auto run = [&](unsigned threads, bool sync, int workers) {
    auto c = fixture::config(workers, sync, 1 << 20);
    c.apply_threads = threads;
    fixture f(c);
    send(f, 0, wire::cmd::batch_init, init);
    for (int r = 1; r < workers; ++r) send(f, r, wire::cmd::batch_init, zeros, false);
    for (int r = 0; r < workers; ++r) f.got(r).clear();
    f.set_optimizer(std::string(thread_probe::name), params_of(thread_probe{}));
    f.got(0).clear();
    struct result {
      std::vector<float> values;
      std::vector<std::uint64_t> counts;
      std::size_t threads;
    } out;
    for (std::uint64_t seq = 1; seq <= 3; ++seq) {
      // The frames are planned (server/frame_plans.hpp) by the third push at the latest: its
      // keys go to the pool's threads.
      if (seq == 3) update_threads().reset(/*wait=*/threads > 1);
      std::vector<std::uint64_t> ids;
      for (int r = 0; r < workers; ++r) {
        // Worker r's gradient: r + 1 + element / 4 for key k's elements, times seq.
        auto grad = [&](std::uint64_t, std::size_t e) {
          return float(seq) * (float(r + 1) + float(e) / 4);
        };
        ids.push_back(send(f, r, wire::cmd::batch_push, many_keys(n, seq, grad)));
        // In dist_sync no worker is answered before the last one's push is in.
        if (sync && r + 1 < workers) CHECK(responses(f, 0, ids[0]).empty());
        // Its pushes in open rounds, counted on the pool's threads too.
        CHECK(f.sh.open_pushes(r) == (sync && r + 1 < workers ? std::int64_t(n) : 0));
      }
      for (int r = 0; r < workers; ++r) {
        auto got = responses(f, r, ids[static_cast<std::size_t>(r)]);
        REQUIRE(got.size() == 1);
        CHECK(got[0].status == errc::ok);
      }
    }
    // A push re-sent after a restart (the same push numbers) is answered, not applied again.
    const auto again = send(f, 0, wire::cmd::batch_push,
                            many_keys(n, 3, [](std::uint64_t, std::size_t) { return 1e6f; }));
    if (!sync || workers == 1) {
      auto got = responses(f, 0, again);
      REQUIRE(got.size() == 1);
      CHECK(got[0].status == errc::ok);
    }
    out.values = pulled(f, zeros);
    out.counts = f.counts;
    out.threads = update_threads().count();
    // A version per round in dist_sync, per push applied in dist_async.
    const std::uint64_t version = sync ? 3 : 3 * static_cast<std::uint64_t>(workers);
    CHECK(f.version(n, 1) == version);
    CHECK(f.version(97, 3) == version);
    return out;
  };
  for (auto [sync, workers] : {std::pair{true, 2}, std::pair{true, 1}, std::pair{false, 2}}) {
    CAPTURE(sync);
    CAPTURE(workers);
    const auto alone = run(1, sync, workers), pooled = run(4, sync, workers);
    CHECK(alone.threads == 1);
    CHECK(pooled.threads > 1);  // the keys were updated on more than one thread
    CHECK(pooled.values == alone.values);
    CHECK(pooled.counts == alone.counts);  // as many changes, reported once per frame
    // Key k's element e: its init, plus 2 x each worker's gradient of each of the three pushes.
    for (std::uint64_t k : {std::uint64_t{1}, std::uint64_t{97}, n}) {
      const std::size_t at = (k - 1) + 2 * ((k - 1) / 97);  // keys before k: 1 or 3 elements
      for (std::size_t e = 0; e < (k % 97 == 0 ? 3u : 1u); ++e) {
        float want = float(k + e);
        for (int r = 0; r < workers; ++r)
          for (int seq = 1; seq <= 3; ++seq) want += 2 * float(seq) * (float(r + 1) + float(e) / 4);
        CHECK(alone.values[at + e] == want);
      }
    }
  }
}

TEST_CASE("what a batched push or pull reads of a slice lies in the bytes they prefetch" *
          doctest::timeout(10)) {
  // batch_ops prefetches a slice's first slice_hot_bytes some keys ahead; a field it reads that
  // moved past them would be a cache miss per key again.
  using slice = shard_t::slice;
  const slice s{};
  const auto* at = reinterpret_cast<const char*>(&s);
  auto end_of = [&](const auto& field) {
    return static_cast<std::size_t>(reinterpret_cast<const char*>(&field) - at) + sizeof(field);
  };
  for (std::size_t end : {end_of(s.key), end_of(s.type), end_of(s.total), end_of(s.lo),
                          end_of(s.hi), end_of(s.round), end_of(s.value), end_of(s.round_done),
                          end_of(s.applied), end_of(s.cov), end_of(s.batch_stamp)})
    CHECK(end <= kvstore::detail::slice_hot_bytes);
  CHECK(end_of(s.batch_stamp) > kvstore::detail::slice_hot_bytes - 64);  // not prefetching spare
  // A batched pull reads less: up to the value.
  for (std::size_t end : {end_of(s.key), end_of(s.type), end_of(s.total), end_of(s.lo),
                          end_of(s.hi), end_of(s.round), end_of(s.value)})
    CHECK(end <= kvstore::detail::slice_pull_bytes);
  CHECK(end_of(s.value) > kvstore::detail::slice_pull_bytes - 64);
}
