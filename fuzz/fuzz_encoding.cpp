// libFuzzer target: a received payload in any encoding (wire/encoding.hpp), as a server decodes a
// compressed push and a worker a compressed pull's answer. First input byte: bits 0-3 the
// encoding bits (5-15: unknown), bit 4 double instead of float, bits 5-7 where to split the
// decoding in two reads; the rest is the payload. Invariants: view_payload either throws
// kvstore::error(protocol) or accepts a payload of exactly encoded_bytes(count) bytes; reading
// its elements in two pieces, as copies or as sums onto zeros, gives the same values and never
// reads outside the payload; and encoding those values again gives back the same bytes (2-bit:
// every value is 0 or +-threshold and the residual stays 0; 16-bit: NaNs stay NaNs).
#include <kvstore/wire/encoding.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

using namespace kvstore;

namespace {

void expect(bool ok) {
  if (!ok) std::abort();
}

template <class T>
void one(unsigned bits, unsigned split, std::span<const std::byte> payload) {
  const auto e = static_cast<wire::encoding>(bits);
  wire::payload_view<T> v;
  try {
    v = wire::view_payload<T>(e, payload);
  } catch (const error& err) {
    expect(err.code() == make_error_code(errc::protocol));
    return;
  }
  expect(bits < wire::encoding_count);
  expect(wire::encoded_bytes(e, v.count, sizeof(T)) == payload.size());
  const std::size_t n = static_cast<std::size_t>(v.count);
  const std::size_t cut = n * split / 7;
  std::vector<T> copy(n), sum(n, T(0));
  v.copy_to(0, cut, copy.data());
  v.copy_to(cut, n - cut, copy.data() + cut);
  v.add_to(cut, n - cut, sum.data() + cut);
  v.add_to(0, cut, sum.data());
  for (std::size_t i = 0; i < n; ++i)
    expect(std::memcmp(&copy[i], &sum[i], sizeof(T)) == 0 ||
           (std::isnan(copy[i]) && std::isnan(sum[i])) || (copy[i] == 0 && sum[i] == 0));
  std::vector<std::byte> again(payload.size());
  if (e == wire::encoding::two_bit) {
    if (!n) return;
    expect(std::isfinite(v.threshold) && v.threshold > 0);
    for (T x : copy) expect(x == 0 || x == v.threshold || x == -v.threshold);
    float t;
    std::memcpy(&t, payload.data(), sizeof t);
    std::vector<T> residual(n, T(0));
    wire::encode_two_bit(copy.data(), residual.data(), n, t, again.data());
    expect(again == std::vector<std::byte>(payload.begin(), payload.end()));
    for (T r : residual) expect(r == 0);
  } else if (wire::is_16bit(e)) {
    wire::encode_16bit(e, copy.data(), n, again.data());
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t in, out;
      std::memcpy(&in, payload.data() + 2 * i, 2);
      std::memcpy(&out, again.data() + 2 * i, 2);
      const bool nan = (in & 0x7FFF) > (e == wire::encoding::fp16 ? 0x7C00 : 0x7F80);
      expect(nan ? (out & 0x7FFF) > (e == wire::encoding::fp16 ? 0x7C00 : 0x7F80) : in == out);
    }
  } else {
    expect(n == 0 || std::memcmp(copy.data(), payload.data(), payload.size()) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > (64 << 10)) return 0;
  const unsigned mode = data[0];
  // An exact-size heap copy, so ASan sees any read past the payload.
  auto* p = new std::byte[size - 1];
  if (size > 1) std::memcpy(p, data + 1, size - 1);
  const std::span<const std::byte> payload(p, size - 1);
  if (mode & 16)
    one<double>(mode & 15, mode >> 5, payload);
  else
    one<float>(mode & 15, mode >> 5, payload);
  delete[] p;
  return 0;
}
