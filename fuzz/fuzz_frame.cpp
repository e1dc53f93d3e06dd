// libFuzzer target: wire::decode of arbitrary 80-byte headers, under the full and the pre-auth
// limits. Invariants: decode never reads past the 80 bytes (shorter inputs are padded), a refusal
// always says why, an accepted header re-encodes to exactly the same bytes and respects the
// limits it was decoded under, and encode -> decode is the identity for any header.
#include <kvstore/transport/auth.hpp>
#include <kvstore/wire/frame.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace kvstore;

namespace {

bool same(const wire::header& a, const wire::header& b) {
  return a.command == b.command && a.flags == b.flags && a.meta_len == b.meta_len &&
         a.payload_len == b.payload_len && a.key == b.key && a.req_id == b.req_id &&
         a.offset == b.offset && a.total == b.total && a.priority == b.priority &&
         a.sender == b.sender && a.type == b.type && a.status == b.status && a.aux == b.aux;
}

void check(const std::byte* p, const wire::limits& lim) {
  wire::header h;
  std::string why;
  if (!wire::decode(p, h, lim, why)) {
    if (why.empty()) std::abort();
    return;
  }
  if (!why.empty()) std::abort();
  if (h.meta_len > lim.max_meta || h.payload_len > lim.max_payload) std::abort();
  // Whole elements of the type, or of the encoding a push, pull or data frame names.
  if (h.type != wire::dtype::none && h.payload_len % wire::payload_unit(h) != 0) std::abort();
  auto again = wire::encode(h);
  if (std::memcmp(again.data(), p, wire::header_size) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // An exact-size heap copy, so ASan sees any read past the header.
  auto* p = new std::byte[wire::header_size]();
  std::memcpy(p, data, size < wire::header_size ? size : wire::header_size);
  check(p, wire::limits{});
  wire::limits pre_auth;  // what an acceptor allows before the token proof
  pre_auth.max_payload = 0;
  pre_auth.max_meta = transport::proof_size;
  check(p, pre_auth);

  // Any header with a valid command and type survives encode -> decode unchanged.
  wire::header h;
  h.command = static_cast<wire::cmd>(1 + std::to_integer<unsigned>(p[6]) %
                                             static_cast<unsigned>(wire::cmd::last_));
  std::memcpy(&h.flags, p + 8, 4);
  std::memcpy(&h.meta_len, p + 12, 4);
  std::memcpy(&h.key, p + 24, 8);
  std::memcpy(&h.req_id, p + 32, 8);
  std::memcpy(&h.offset, p + 40, 8);
  std::memcpy(&h.total, p + 48, 8);
  std::memcpy(&h.priority, p + 56, 4);
  std::memcpy(&h.sender, p + 60, 4);
  std::memcpy(&h.status, p + 68, 4);
  std::memcpy(&h.aux, p + 72, 8);
  h.type = static_cast<wire::dtype>(std::to_integer<unsigned>(p[64]) % 3);
  h.payload_len = (std::to_integer<unsigned>(p[16]) | std::to_integer<unsigned>(p[17]) << 8) * 8u;
  wire::limits big;
  big.max_meta = UINT32_MAX;
  big.max_payload = UINT64_MAX;
  auto b = wire::encode(h);
  wire::header back;
  std::string why;
  if (!wire::decode(b.data(), back, big, why) || !same(h, back)) std::abort();
  delete[] p;
  return 0;
}
