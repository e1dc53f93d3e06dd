// libFuzzer target: the server snapshot loader (server/checkpoint.hpp) on arbitrary bytes, raw or
// wrapped in a valid header whose length and CRC match, so the body parser itself is reached.
// Invariants: only kvstore::error(bad_file) escapes, and an accepted snapshot of the current
// version re-encodes to the same bytes (one of an older version to bytes that decode and
// re-encode unchanged).
#include <kvstore/server/checkpoint.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

using namespace kvstore;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    // Wrap the body in a well-formed header so the checks past the checksum are fuzzed.
    wire::meta_writer h;
    h.raw(std::string_view(detail::snapshot_magic, sizeof detail::snapshot_magic))
        .u32(detail::snapshot_version)
        .u64(bytes.size())
        .u32(detail::checksum(bytes));
    bytes = h.take() + bytes;
  }
  try {
    auto s = detail::decode_snapshot(bytes, "fuzz");
    const std::string again = detail::encode_snapshot(s);
    std::uint32_t version = 0;  // accepted, so the header is whole: magic, then the version
    std::memcpy(&version, bytes.data() + sizeof detail::snapshot_magic, sizeof version);
    if (version == detail::snapshot_version
            ? again != bytes
            : detail::encode_snapshot(detail::decode_snapshot(again, "fuzz")) != again)
      std::abort();
  } catch (const error& e) {
    if (e.code() != make_error_code(errc::bad_file)) std::abort();
  }
  return 0;
}
