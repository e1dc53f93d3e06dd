// Mode tags, key, op: the small vocabulary every other header uses.
#pragma once

#include <kvstore/error.hpp>

#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace kvstore {

/// Mode tag: one process, one or many devices.
struct local {};
/// Mode tag: worker processes talking to server processes over TCP.
struct dist {};

template <class Mode, class T = float>
class KVStore;

/// A key: an integer or a name. Implicit from any integer, std::string, std::string_view and
/// string literal. Names are hashed to a 64-bit id (top bit set); the name is kept for messages
/// and to detect the (unlikely) collision of two names.
class key {
 public:
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  key(I v) noexcept  // NOLINT(google-explicit-constructor): implicit by contract
      : id_(static_cast<std::uint64_t>(static_cast<std::int64_t>(v))) {}
  key(std::string_view name) : id_(hash(name)), name_(name), named_(true) {}  // NOLINT
  key(const std::string& name) : key(std::string_view(name)) {}              // NOLINT
  key(const char* name) : key(std::string_view(name)) {}                     // NOLINT

  /// The id that identifies the key in stores and on the wire.
  std::uint64_t id() const noexcept { return id_; }
  bool is_named() const noexcept { return named_; }
  /// The name for a named key, empty for an integer key.
  const std::string& name() const noexcept { return name_; }
  /// For messages: `3` or `"fc1.w"`.
  std::string str() const {
    return named_ ? "\"" + name_ + "\"" : std::to_string(static_cast<std::int64_t>(id_));
  }

  friend bool operator==(const key& a, const key& b) noexcept { return a.id_ == b.id_; }

  /// FNV-1a 64 with the top bit set, so names rarely meet small non-negative integer keys.
  static constexpr std::uint64_t hash(std::string_view s) noexcept {
    std::uint64_t h = 14695981039346656037ull;
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    return h | (1ull << 63);
  }

 private:
  std::uint64_t id_;
  std::string name_;
  bool named_ = false;
};

namespace detail {
/// Shared state of one asynchronous operation made of `remaining` parts (one per key, slice or
/// message). The first error wins; the op is done when every part has completed.
struct op_state {
  explicit op_state(std::size_t parts = 1) : remaining(parts) {}
  std::mutex m;
  std::condition_variable cv;
  std::size_t remaining;
  std::exception_ptr error;
  std::atomic<bool> finished{false};  // remaining reached 0 (read without the lock by spinners)
  unsigned spin_us = 0;               // wait() polls `finished` this long before sleeping

  void complete_part(std::exception_ptr e = nullptr) {
    std::lock_guard lk(m);
    if (e && !error) error = e;
    if (remaining > 0 && --remaining == 0) {
      finished.store(true, std::memory_order_release);
      cv.notify_all();
    }
  }
  void add_parts(std::size_t n) {
    std::lock_guard lk(m);
    remaining += n;
  }
};
}  // namespace detail

/// Handle of one asynchronous operation. Copies share the operation.
/// Completion rule: wait() returns once every part of the operation has run; it rethrows the
/// operation's first error (a kvstore::error) each time it is called. A default op is done.
class op {
 public:
  op() = default;
  explicit op(std::shared_ptr<detail::op_state> s) : s_(std::move(s)) {}

  /// Blocks until done; throws the operation's error, if any.
  void wait() const {
    if (!s_) return;
    if (s_->spin_us && !s_->finished.load(std::memory_order_acquire)) spin();
    std::unique_lock lk(s_->m);
    s_->cv.wait(lk, [&] { return s_->remaining == 0; });
    if (s_->error) std::rethrow_exception(s_->error);
  }
  /// True once done (successfully or not); never blocks.
  bool ready() const {
    if (!s_) return true;
    std::lock_guard lk(s_->m);
    return s_->remaining == 0;
  }
  /// An op that is already done.
  static op done() { return op{}; }

 private:
  // Polls for completion for up to spin_us before wait() sleeps: an answer that comes within it
  // is seen without waking this thread from sleep.
  void spin() const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(s_->spin_us);
    do {
      for (int i = 0; i < 32; ++i) {
        if (s_->finished.load(std::memory_order_acquire)) return;
        std::this_thread::yield();
      }
    } while (std::chrono::steady_clock::now() < until);
  }

  std::shared_ptr<detail::op_state> s_;
};

}  // namespace kvstore
