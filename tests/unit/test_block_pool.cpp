// detail/block_pool.hpp: the blocks of a one-key op, made on the caller's thread and freed on the
// io thread. Blocks freed on one thread must come back to another in batches, never be handed
// out twice, stay within the pool's bound, and go back to the system when a thread ends.
#include <kvstore/detail/block_pool.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <thread>
#include <vector>

using kvstore::detail::block_pool;

namespace {
// Blocks of `size` bytes, allocated on a thread of their own and returned (it ends at once, so
// its cache's blocks go back to the system: only the shared stack keeps any).
std::vector<void*> allocate_on_thread(std::size_t n, std::size_t size) {
  std::vector<void*> blocks;
  std::thread([&] {
    for (std::size_t i = 0; i < n; ++i) blocks.push_back(block_pool::allocate(size));
  }).join();
  return blocks;
}
void free_on_thread(const std::vector<void*>& blocks, std::size_t size) {
  std::thread([&] {
    for (void* p : blocks) block_pool::deallocate(p, size);
  }).join();
}
}  // namespace

TEST_CASE("block_pool: blocks freed on one thread serve another's allocations" *
          doctest::timeout(30)) {
  if (!block_pool::enabled) return;  // (AddressSanitizer builds: plain new and delete)
  constexpr std::size_t size = 160;  // an op_state with its shared_ptr count
  const std::size_t before = block_pool::shared_blocks(size);
  auto first = allocate_on_thread(1000, size);
  std::thread freer([&] {
    for (void* p : first) block_pool::deallocate(p, size);
    // What this thread keeps past local_max went to the shared stack, in whole batches.
    const std::size_t shared = block_pool::shared_blocks(size) - before;
    CHECK(shared >= 1000 - block_pool::local_max);
    CHECK(shared % block_pool::batch == 0);
  });
  freer.join();
  const std::size_t shared = block_pool::shared_blocks(size);
  const std::set<void*> freed(first.begin(), first.end());
  auto second = allocate_on_thread(shared - before, size);
  for (void* p : second) CHECK(freed.count(p) == 1);  // each came from the shared stack
  CHECK(block_pool::shared_blocks(size) == before);
  free_on_thread(second, size);
}

TEST_CASE("block_pool: no block is handed out twice while held" * doctest::timeout(30)) {
  // Two threads allocate and free blocks of several sizes, passing them across, while each
  // block holds its owner's pattern: a block given out twice would be overwritten.
  constexpr std::size_t sizes[] = {1, 64, 65, 160, 168, 512, 513, 4096};
  constexpr int rounds = 20;
  constexpr std::size_t per_round = 3000;
  struct held {
    std::uint32_t* p;
    std::size_t size;
    std::uint32_t mark;
  };
  std::vector<held> passed;
  std::uint32_t next_mark = 1;
  auto words = [](std::size_t size) { return std::max<std::size_t>(1, size / 4); };
  auto fill = [&](held& h) {
    for (std::size_t i = 0; i < words(h.size); ++i) h.p[i] = h.mark;
  };
  auto intact = [&](const held& h) {
    for (std::size_t i = 0; i < words(h.size); ++i)
      if (h.p[i] != h.mark) return false;
    return true;
  };
  std::size_t bad = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<held> made;
    std::thread([&] {
      for (std::size_t i = 0; i < per_round; ++i) {
        const std::size_t size = sizes[i % std::size(sizes)];
        held h{static_cast<std::uint32_t*>(block_pool::allocate(size < 4 ? 4 : size)),
               size < 4 ? 4 : size, next_mark++};
        fill(h);
        made.push_back(h);
      }
      for (const auto& h : passed) bad += !intact(h);  // still held: untouched
    }).join();
    std::thread([&] {
      for (const auto& h : passed) {
        bad += !intact(h);
        block_pool::deallocate(h.p, h.size);
      }
    }).join();
    passed = std::move(made);
  }
  for (const auto& h : passed) {
    bad += !intact(h);
    block_pool::deallocate(h.p, h.size);
  }
  CHECK(bad == 0);
}

TEST_CASE("block_pool: the shared stack keeps at most shared_max batches per size" *
          doctest::timeout(30)) {
  if (!block_pool::enabled) return;
  constexpr std::size_t size = 512;
  const std::size_t cap = block_pool::shared_max * block_pool::batch;
  auto blocks = allocate_on_thread(cap + 4 * block_pool::local_max, size);
  free_on_thread(blocks, size);
  CHECK(block_pool::shared_blocks(size) == cap);
  // Blocks past the largest size are not pooled at all.
  const std::size_t big = block_pool::granule * block_pool::classes + 1;
  free_on_thread(allocate_on_thread(100, big), big);
  CHECK(block_pool::shared_blocks(size) == cap);
  // A thread that runs out takes them back, batch by batch.
  auto again = allocate_on_thread(cap, size);
  CHECK(block_pool::shared_blocks(size) == 0);
  free_on_thread(again, size);
}

TEST_CASE("block_pool: a shared_ptr made with make_pooled frees into the pool" *
          doctest::timeout(30)) {
  struct state {
    std::uint64_t words[16];
  };
  std::vector<std::shared_ptr<state>> made;
  std::thread([&] {
    for (int i = 0; i < 500; ++i) {
      made.push_back(kvstore::detail::make_pooled<state>());
      made.back()->words[0] = static_cast<std::uint64_t>(i);
    }
  }).join();
  for (int i = 0; i < 500; ++i)
    CHECK(made[static_cast<std::size_t>(i)]->words[0] == static_cast<std::uint64_t>(i));
  std::thread([&] { made.clear(); }).join();
  CHECK(made.empty());
}
