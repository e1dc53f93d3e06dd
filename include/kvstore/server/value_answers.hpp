// The data frames that answer a pull on a server: a slice's value (plain or in a 16-bit
// encoding), a range of its elements or some of its rows, and a batched pull's values, cut into
// frames of at most chunk_bytes and sent through the asker's Port (see server/shard.hpp). The
// shard decides when a pull is answered; this file only builds and sends its frames.
#pragma once

#include <kvstore/server/request_checks.hpp>
#include <kvstore/server/slice.hpp>
#include <kvstore/wire/encoding.hpp>
#include <kvstore/wire/frame.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace kvstore::detail {

template <class Port>
struct value_answers {
  using slice = key_slice<Port>;

  /// The slice's value, in data frames of at most `chunk_bytes` (the last flagged), or in the
  /// encoding the pull's flags ask for.
  static void send_value(const Port& from, const wire::header& h, const slice& s,
                         std::size_t chunk_bytes) {
    if (wire::encoding_bits(h.flags)) return send_encoded(from, h, s, chunk_bytes);
    auto [keep, base] = s.value.share();
    send_frames(from, data_header(s, h), base, s.size(), s.elem(), s.lo, 0, keep, chunk_bytes);
  }

  /// The slice's value in the 16-bit encoding the pull asks for (its flags, checked by
  /// pull_encoding), encoded once and sent in data frames of at most `chunk_bytes`, each flagged
  /// with the encoding.
  static void send_encoded(const Port& from, const wire::header& h, const slice& s,
                           std::size_t chunk_bytes) {
    const wire::encoding e = slice_checks<slice>::pull_encoding(h);
    // The slice's last answer when no frame still holds it: a new buffer per pull costs page
    // faults and zeroing (32 MiB of them for a 64 MiB slice).
    if (!s.encoded || s.encoded.use_count() > 1) s.encoded = std::make_shared<bytes>();
    auto buf = s.encoded;
    buf->resize(wire::encoded_bytes(e, s.size(), s.elem()));
    with_dtype(s.type, [&]<class T>() {
      wire::encode_16bit(e, reinterpret_cast<const T*>(s.value.data()), s.size(), buf->data());
    });
    send_frames(from, data_header(s, h), buf->data(), s.size(), 2, s.lo, wire::encoding_flags(e),
                buf, chunk_bytes);
  }

  /// Elements [r.offset, r.offset + r.length) of the slice, in data frames of at most
  /// `chunk_bytes` flagged flag_range, their offsets counted from the range's first element.
  static void send_range(const Port& from, const wire::header& h, const slice& s,
                         wire::range_meta r, std::size_t chunk_bytes) {
    auto [keep, at] = s.value.share();
    send_frames(from, data_header(s, h), at + (r.offset - s.lo) * s.elem(), r.length, s.elem(), 0,
                wire::flag_range, keep, chunk_bytes);
  }

  /// The rows listed (checked already), copied into data frames of at most `chunk_bytes`
  /// flagged flag_rows (offset: index of the frame's first row in the list).
  static void send_rows(const Port& from, const wire::header& h, const slice& s,
                        const std::vector<std::int64_t>& rows, std::size_t chunk_bytes) {
    const std::uint64_t rl = s.row_length, row_bytes = rl * s.elem();
    const std::size_t per =
        std::max<std::size_t>(1, chunk_bytes / std::max<std::uint64_t>(row_bytes, 1));
    std::size_t i = 0;
    do {
      const std::size_t n = std::min(per, rows.size() - i);
      auto buf = std::make_shared<bytes>(n * row_bytes);
      for (std::size_t j = 0; j < n; ++j)
        std::memcpy(
            buf->data() + j * row_bytes,
            s.value.data() + (static_cast<std::uint64_t>(rows[i + j]) * rl - s.lo) * s.elem(),
            row_bytes);
      wire::header f = data_header(s, h);
      f.offset = i;
      f.flags = wire::flag_rows | (i + n == rows.size() ? wire::flag_last : 0u);
      from.send(f, {buf->data(), buf->size()}, buf);
      i += n;
    } while (i < rows.size());
  }

  /// `count` elements of `elem` bytes at `base` (alive while `keep` is) in data frames `f` of at
  /// most `chunk_bytes` (one element at least), each at offset `first` plus its first element's
  /// index and flagged `flags`, the last one also flag_last.
  static void send_frames(const Port& to, wire::header f, const std::byte* base,
                          std::uint64_t count, std::size_t elem, std::uint64_t first,
                          std::uint32_t flags, const std::shared_ptr<const void>& keep,
                          std::size_t chunk_bytes) {
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes / elem);
    for (std::uint64_t off = 0; off < count; off += chunk) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk, count - off);
      f.offset = first + off;
      f.flags = flags | (off + n == count ? wire::flag_last : 0u);
      to.send(f, {base + off * elem, static_cast<std::size_t>(n * elem)}, keep);
    }
  }

  static wire::header data_header(const slice& s, const wire::header& asked) {
    return data_header(asked, s.total, s.type);
  }
  /// An answer's data frame header for request `asked`, of `total` elements of `type` in all
  /// (a slice's, or a batched pull's keys together).
  static wire::header data_header(const wire::header& asked, std::uint64_t total,
                                  wire::dtype type) {
    wire::header f;
    f.command = wire::cmd::data;
    f.req_id = asked.req_id;
    f.key = asked.key;
    f.total = total;
    f.type = type;
    f.priority = asked.priority;
    return f;
  }
};

}  // namespace kvstore::detail
