// libFuzzer target: the server snapshot codec (wire/snapshot.hpp) on arbitrary bytes, raw or
// wrapped in a valid header whose length and CRC match, so the body parser itself is reached.
// Invariants: only kvstore::error(bad_file) escapes, and an accepted snapshot of the current
// version re-encodes to the same bytes (one of an older version to bytes that decode and
// re-encode unchanged).
#include <kvstore/wire/snapshot.hpp>

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
    bytes = wire::wrap_snapshot_body(bytes);
  }
  try {
    auto s = wire::decode_snapshot(bytes, "fuzz");
    const std::string again = wire::encode_snapshot(s);
    std::uint32_t version = 0;  // accepted, so the header is whole: magic, then the version
    std::memcpy(&version, bytes.data() + sizeof wire::snapshot_magic, sizeof version);
    if (version == wire::snapshot_version
            ? again != bytes
            : wire::encode_snapshot(wire::decode_snapshot(again, "fuzz")) != again)
      std::abort();
  } catch (const error& e) {
    if (e.code() != make_error_code(errc::bad_file)) std::abort();
  }
  return 0;
}
