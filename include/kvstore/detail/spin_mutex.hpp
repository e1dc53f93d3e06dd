// A mutex that tries a little while before it sleeps, for a lock that two threads handing work to
// each other hold for a few hundred nanoseconds at a time: a worker's caller queuing frames and
// its io thread writing them and taking the answers (transport/tcp_connection.hpp, client/).
// A std::mutex found taken sleeps in the kernel at once, and its owner's unlock must wake it: two
// system calls and a context switch, more than the lock is ever held (and more still in a virtual
// machine). glibc's adaptive mutexes do the same; std::mutex cannot ask for one.
#pragma once

#include <mutex>
#include <thread>

namespace kvstore::detail {

class spin_mutex {
 public:
  /// Tries up to spin_tries times, pausing between, then sleeps as a std::mutex does. On one
  /// core no other thread could let go meanwhile: it sleeps at once.
  void lock() noexcept {
    if (several_cores())
      for (int i = 0; i < spin_tries; ++i) {
        if (m_.try_lock()) return;
        pause();
      }
    m_.lock();
  }
  bool try_lock() noexcept { return m_.try_lock(); }
  void unlock() noexcept { m_.unlock(); }

  /// How many times lock() tries before it sleeps (with a pause between: microseconds in all).
  static constexpr int spin_tries = 100;

 private:
  static bool several_cores() noexcept {
    static const bool several = std::thread::hardware_concurrency() > 1;
    return several;
  }
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
  }

  std::mutex m_;
};

}  // namespace kvstore::detail
