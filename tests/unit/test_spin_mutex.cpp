// detail/spin_mutex.hpp: the lock of a connection's send queue and of a worker's client. It must
// exclude as a std::mutex does, whether a waiter gets it while spinning or after it slept.
#include <kvstore/detail/spin_mutex.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

using kvstore::detail::spin_mutex;

TEST_CASE("spin_mutex: threads taking it in turn lose no update" * doctest::timeout(60)) {
  spin_mutex m;
  std::uint64_t counter = 0;  // not atomic: only the lock keeps the updates apart
  constexpr int threads = 4, rounds = 100'000;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard lk(m);
        ++counter;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(counter == std::uint64_t{threads} * rounds);
}

TEST_CASE("spin_mutex: try_lock fails while another thread holds it" * doctest::timeout(10)) {
  spin_mutex m;
  m.lock();
  bool got = true;
  std::thread([&] { got = m.try_lock(); }).join();
  CHECK_FALSE(got);
  m.unlock();
  std::thread([&] {
    got = m.try_lock();
    if (got) m.unlock();
  }).join();
  CHECK(got);
}

TEST_CASE("spin_mutex: a waiter that spun out sleeps until the holder lets go" *
          doctest::timeout(10)) {
  spin_mutex m;
  std::atomic<bool> released{false};
  std::atomic<bool> taken{false};
  m.lock();
  std::thread waiter([&] {
    std::lock_guard lk(m);
    taken = true;
    CHECK(released.load());  // not before the holder let go
  });
  // Far longer than the spinning lasts: the waiter is asleep in the kernel by now.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(taken.load());
  released = true;
  m.unlock();
  waiter.join();
  CHECK(taken.load());
}
