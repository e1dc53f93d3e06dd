// A worker's side of wire compression: which encoding a key's pushes and pulls use (the key's own
// init_options::compression, else the store's set_gradient_compression), the payloads of a
// compressed push's frames, and the per-key residual of two_bit's error feedback. The element
// conversions themselves are wire/encoding.hpp's; the frames are built by client/requests.hpp.
#pragma once

#include <kvstore/client/key_record.hpp>
#include <kvstore/options.hpp>
#include <kvstore/wire/encoding.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kvstore::detail {

static_assert(static_cast<int>(wire::encoding::fp16) == compression::fp16 &&
                  static_cast<int>(wire::encoding::bf16) == compression::bf16 &&
                  static_cast<int>(wire::encoding::bf16_trunc) == compression::bf16_trunc &&
                  static_cast<int>(wire::encoding::two_bit) == compression::two_bit,
              "the wire numbers encodings as compression::kind");

/// A compression setting in one word: its kind and its threshold's bits.
inline std::uint64_t packed(const compression& c) noexcept {
  return static_cast<std::uint64_t>(c.type) << 32 | std::bit_cast<std::uint32_t>(c.threshold);
}

/// The store's compression (set_gradient_compression), read by every push and pull. Set while
/// other threads may push, so it is one atomic word.
class compression_setting {
 public:
  void set(const compression& c) noexcept { packed_.store(packed(c), std::memory_order_release); }
  compression get() const noexcept {
    const std::uint64_t p = packed_.load(std::memory_order_acquire);
    return {static_cast<compression::kind>(p >> 32),
            std::bit_cast<float>(static_cast<std::uint32_t>(p))};
  }
  /// Key m's compression: its own (init_options) over the store's.
  compression of(const key_record& m) const noexcept {
    return m.own_compression ? m.compression : get();
  }

 private:
  std::atomic<std::uint64_t> packed_{0};
};

/// How pushes of a key compressed with c travel.
inline wire::encoding push_encoding(const compression& c) noexcept {
  return static_cast<wire::encoding>(c.type);
}
/// How pulls travel: two_bit compresses pushes only, its pulls are plain.
inline wire::encoding pull_encoding(const compression& c) noexcept {
  return c.type == compression::two_bit ? wire::encoding::plain : push_encoding(c);
}

/// Elements per frame of a push in encoding e, so a frame's payload stays within chunk_bytes
/// (at least 1; 2-bit frames hold whole bytes of codes, a multiple of 4).
inline std::size_t elements_per_frame(wire::encoding e, std::size_t chunk_bytes) noexcept {
  if (e == wire::encoding::two_bit)
    return 4 * std::max<std::size_t>(
                   1, chunk_bytes > wire::two_bit_head ? chunk_bytes - wire::two_bit_head : 1);
  return std::max<std::size_t>(1, chunk_bytes / 2);
}

/// This worker's two_bit residual of key m (m.total elements of T, zero at first). Only the
/// key's ops touch it, and the engine runs those one at a time, in order.
template <class T>
T* residual_of(key_record& m) {
  if (!m.residual) m.residual = std::make_shared<std::vector<T>>(m.total, T{});
  return static_cast<std::vector<T>*>(m.residual.get())->data();
}

/// A buffer of `bytes` for key m's compressed push: the key's last one when no frame of an
/// earlier push still holds it (only the key's ops, one at a time, take it), else a new one. A
/// new buffer per push costs page faults and zeroing: 32 MiB of them for a 64 MiB key in fp16.
inline std::shared_ptr<std::vector<std::byte>> push_buffer(key_record& m, std::size_t bytes) {
  if (!m.encoded || m.encoded.use_count() > 1)
    m.encoded = std::make_shared<std::vector<std::byte>>();
  else
    std::atomic_thread_fence(std::memory_order_acquire);  // the last send that read it is done
  m.encoded->resize(bytes);                               // zeroes only what grows
  return m.encoded;
}

/// One compressed push: every frame's elements encoded one after the other into one buffer.
template <class T>
class encoded_push {
 public:
  struct frame {
    std::uint64_t offset = 0, count = 0;  // elements [offset, offset + count) of the key
    std::size_t at = 0, bytes = 0;        // its payload in the buffer
  };

  encoded_push(wire::encoding e, float threshold) : e_(e), threshold_(threshold) {}

  /// Adds a frame of elements [offset, offset + count).
  void add(std::uint64_t offset, std::uint64_t count) {
    const std::size_t bytes = wire::encoded_bytes(e_, count, sizeof(T));
    frames_.push_back({offset, count, size_, bytes});
    size_ += bytes;
  }

  /// Payload bytes of all frames.
  std::size_t size() const noexcept { return size_; }

  /// Encodes every frame of `value` (two_bit: with and into `residual`, the key's) into `buf`
  /// (size() bytes), which the frames' payloads point into.
  void encode(std::span<const T> value, T* residual, std::vector<std::byte>& buf) const {
    for (const frame& f : frames_) {
      std::byte* dst = buf.data() + f.at;
      if (e_ == wire::encoding::two_bit)
        wire::encode_two_bit(value.data() + f.offset, residual + f.offset, f.count, threshold_,
                             dst);
      else
        wire::encode_16bit(e_, value.data() + f.offset, f.count, dst);
    }
  }

  const std::vector<frame>& frames() const noexcept { return frames_; }

 private:
  wire::encoding e_;
  float threshold_;
  std::vector<frame> frames_;
  std::size_t size_ = 0;
};

}  // namespace kvstore::detail
