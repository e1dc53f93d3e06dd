// Small blocks recycled between threads in batches: what a one-key op allocates on the caller's
// thread (its op_state, the engine's op) is freed on the io thread that completes it. glibc's
// per-thread caches cannot pass blocks across: every such malloc took the arena's slow path and
// lock (about 230 instructions), every free too, and on many cores the two threads met on that
// lock (issue 12: jemalloc, which passes blocks in batches, took 1.7 us off a 4 KiB push there).
// Here a thread keeps up to local_max free blocks per size; past that it hands a batch of them to
// a shared stack, and a thread that runs out takes a whole batch back: one lock per batch.
#pragma once

#include <kvstore/detail/spin_mutex.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

// Under AddressSanitizer each block lives its own life: a use after free stays one.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSTORE_BLOCK_POOL_OFF 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVSTORE_BLOCK_POOL_OFF 1
#endif

namespace kvstore::detail {

class block_pool {
 public:
#ifdef KVSTORE_BLOCK_POOL_OFF
  static constexpr bool enabled = false;
#else
  static constexpr bool enabled = true;
#endif
  static constexpr std::size_t granule = 64;    // sizes are rounded up to a multiple of this
  static constexpr std::size_t classes = 8;     // so blocks of up to 512 bytes are pooled
  static constexpr std::size_t local_max = 64;  // free blocks a thread keeps per size
  static constexpr std::size_t batch = 32;      // blocks handed between threads at a time
  // Batches the shared stack keeps per size: 8,192 blocks, room for the blocks of a few
  // thousand one-key ops in flight (at most 0.5 MiB of 64-byte blocks, 4 MiB of 512-byte ones).
  static constexpr std::size_t shared_max = 256;

  /// A block of at least n bytes (aligned as operator new aligns).
  static void* allocate(std::size_t n) {
    if (!pooled(n)) return ::operator new(n);
    cache& t = local();
    if (t.gone) return ::operator new(n);
    const std::size_t c = class_of(n);
    bin& b = t.bins[c];
    if (b.count == 0 && !take_batch(c, b)) return ::operator new(size_of(c));
    return b.items[--b.count];
  }
  /// Gives back a block from allocate(n), from any thread.
  static void deallocate(void* p, std::size_t n) noexcept {
    if (!pooled(n)) return ::operator delete(p);
    cache& t = local();
    if (t.gone) return ::operator delete(p);
    const std::size_t c = class_of(n);
    bin& b = t.bins[c];
    if (b.count == local_max) give_batch(c, b);
    if (b.count == 0) reap_at_exit();  // (cheap after the first time)
    b.items[b.count++] = p;
  }

  /// Free blocks the shared stack holds for blocks of n bytes (for tests).
  static std::size_t shared_blocks(std::size_t n) {
    auto& s = shared().stacks[class_of(n)];
    std::lock_guard lk(s.m);
    return s.batches * batch;
  }

 private:
  // A free block's first words chain it to the next block of its batch and, in a batch's first
  // block, to the next batch on the shared stack.
  struct link {
    link* next_block;
    link* next_batch;
  };
  static_assert(granule >= sizeof(link));

  struct bin {
    std::size_t count = 0;
    std::array<void*, local_max> items{};
  };
  // A thread's free blocks. Trivially destructible, so it stays usable while the thread's other
  // thread_local objects are destroyed; a reaper frees its blocks when the thread ends, and
  // blocks freed after that go straight back to the system.
  struct cache {
    std::array<bin, classes> bins;
    bool gone;
  };
  struct reaper {
    reaper() = default;
    reaper(const reaper&) = delete;
    reaper& operator=(const reaper&) = delete;
    ~reaper() {
      cache& t = local();
      t.gone = true;
      for (auto& b : t.bins) {
        for (std::size_t i = 0; i < b.count; ++i) ::operator delete(b.items[i]);
        b.count = 0;
      }
    }
  };
  static void reap_at_exit() noexcept {
    thread_local reaper r;
    (void)r;
  }
  struct stack {
    spin_mutex m;
    link* top = nullptr;
    std::size_t batches = 0;
  };
  struct shared_stacks {
    std::array<stack, classes> stacks;
  };

  static bool pooled(std::size_t n) noexcept { return enabled && n != 0 && n <= granule * classes; }
  static std::size_t class_of(std::size_t n) noexcept { return (n - 1) / granule; }
  static std::size_t size_of(std::size_t c) noexcept { return (c + 1) * granule; }

  static cache& local() noexcept {
    thread_local cache c{};
    return c;
  }
  // Never destroyed: a thread may free a block after static destructors ran.
  static shared_stacks& shared() noexcept {
    static shared_stacks* s = new shared_stacks;
    return *s;
  }

  // The thread's bin is full: its last `batch` blocks go to the shared stack as one chain, or
  // back to the system when the stack holds shared_max batches already.
  static void give_batch(std::size_t c, bin& b) noexcept {
    link* head = nullptr;
    for (std::size_t i = 0; i < batch; ++i) {
      auto* l = static_cast<link*>(b.items[--b.count]);
      l->next_block = head;
      head = l;
    }
    stack& s = shared().stacks[c];
    {
      std::lock_guard lk(s.m);
      if (s.batches < shared_max) {
        head->next_batch = s.top;
        s.top = head;
        ++s.batches;
        return;
      }
    }
    while (head) {
      link* next = head->next_block;
      ::operator delete(head);
      head = next;
    }
  }
  // The thread's bin is empty: it takes one batch from the shared stack, if there is one.
  static bool take_batch(std::size_t c, bin& b) noexcept {
    stack& s = shared().stacks[c];
    link* head;
    {
      std::lock_guard lk(s.m);
      if (!s.top) return false;
      head = s.top;
      s.top = head->next_batch;
      --s.batches;
    }
    reap_at_exit();
    for (; head; head = head->next_block) b.items[b.count++] = head;
    return true;
  }
};

/// An allocator over block_pool, for std::allocate_shared of states that one thread makes and
/// another frees.
template <class T>
struct pool_allocator {
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                "the pool's blocks are aligned as operator new aligns");
  using value_type = T;
  pool_allocator() noexcept = default;
  template <class U>
  pool_allocator(const pool_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(block_pool::allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { block_pool::deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const pool_allocator<U>&) const noexcept {
    return true;
  }
};

/// std::make_shared with its block from the pool.
template <class T, class... Args>
std::shared_ptr<T> make_pooled(Args&&... args) {
  return std::allocate_shared<T>(pool_allocator<T>{}, std::forward<Args>(args)...);
}

}  // namespace kvstore::detail
