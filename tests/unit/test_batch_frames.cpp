// client/batch_frames.hpp: a batch's keys cut into batched frames. Every key is in exactly one
// frame, of its server; the keys of a server keep their order; a frame holds at most chunk_bytes
// of entries and values and at most batch_frame_keys keys, and at least one key (a key larger
// than chunk_bytes goes alone); the frames' elements add up to the keys'.
#include <kvstore/client/batch_frames.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

using kvstore::detail::batch_frame_keys;
using kvstore::detail::batch_frames;
using kvstore::detail::cut_frames;
using kvstore::wire::batch_entry_size;

namespace {

struct entry {
  int server;
  std::uint64_t total;
};

// The cut's promises, for `es` over `servers` servers.
void check_cut(const std::vector<entry>& es, const batch_frames& c, std::size_t servers,
               std::size_t chunk_bytes, std::size_t elem) {
  REQUIRE(c.order.size() == es.size());
  std::vector<int> seen(es.size(), 0);
  std::size_t next = 0;  // the frames tile order[0, n) in order
  int last_server = -1;
  for (const auto& f : c.frames) {
    CHECK(f.lo == next);
    CHECK(f.hi > f.lo);
    CHECK(f.keys() <= batch_frame_keys);
    CHECK(f.server >= last_server);  // servers in turn
    CHECK(static_cast<std::size_t>(f.server) < servers);
    last_server = f.server;
    std::size_t bytes = 0;
    std::uint64_t elements = 0;
    for (std::size_t k = f.lo; k < f.hi; ++k) {
      const std::uint32_t j = c.order[k];
      REQUIRE(j < es.size());
      ++seen[j];
      CHECK(es[j].server == f.server);
      if (k > f.lo && es[c.order[k - 1]].server == f.server) CHECK(c.order[k - 1] < j);
      bytes += batch_entry_size + es[j].total * elem;
      elements += es[j].total;
    }
    if (f.keys() > 1) CHECK(bytes <= chunk_bytes);
    CHECK(f.elements == elements);
    next = f.hi;
  }
  CHECK(next == es.size());
  for (int s : seen) CHECK(s == 1);
}

}  // namespace

TEST_CASE("keys of three servers, each server's keys in order, frames within chunk_bytes" *
          doctest::timeout(10)) {
  std::vector<entry> es;
  for (std::uint64_t i = 0; i < 1000; ++i) es.push_back({static_cast<int>(i * 7 % 3), i % 13 + 1});
  const std::size_t chunk = 2048;
  const batch_frames c = cut_frames(std::span<const entry>(es), 3, chunk, sizeof(float));
  check_cut(es, c, 3, chunk, sizeof(float));
  CHECK(c.frames.size() > 3);  // 1000 keys of 7 floats on average do not fit 3 frames of 2 KiB
  CHECK(c.frames.front().server == 0);
  CHECK(c.frames.back().server == 2);
}

TEST_CASE("a frame takes at most batch_frame_keys keys; a key over chunk_bytes goes alone" *
          doctest::timeout(10)) {
  std::vector<entry> es(3 * batch_frame_keys + 5, entry{0, 1});
  const batch_frames many =
      cut_frames(std::span<const entry>(es), 1, std::size_t{1} << 30, sizeof(float));
  check_cut(es, many, 1, std::size_t{1} << 30, sizeof(float));
  REQUIRE(many.frames.size() == 4);
  CHECK(many.frames[0].keys() == batch_frame_keys);
  CHECK(many.frames[3].keys() == 5);

  const std::vector<entry> big{{0, 10}, {0, 1000}, {0, 10}};
  const batch_frames alone = cut_frames(std::span<const entry>(big), 1, 256, sizeof(double));
  check_cut(big, alone, 1, 256, sizeof(double));
  REQUIRE(alone.frames.size() == 3);
  CHECK(alone.frames[1].keys() == 1);
  CHECK(alone.frames[1].elements == 1000);
}

TEST_CASE("servers with no keys get no frame; no keys, no frames" * doctest::timeout(10)) {
  const std::vector<entry> es{{3, 2}, {3, 2}, {1, 2}};
  const batch_frames c = cut_frames(std::span<const entry>(es), 5, 4096, sizeof(float));
  check_cut(es, c, 5, 4096, sizeof(float));
  REQUIRE(c.frames.size() == 2);
  CHECK(c.frames[0].server == 1);
  CHECK(c.frames[1].server == 3);
  CHECK(c.order == std::vector<std::uint32_t>{2, 0, 1});
  const std::vector<entry> none;
  CHECK(cut_frames(std::span<const entry>(none), 2, 4096, sizeof(float)).frames.empty());
}
