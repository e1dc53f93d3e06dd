// libFuzzer target: every control-message decoder (wire/messages.hpp, wire/meta.hpp). The first
// input byte picks the decoder, the rest is the message. Invariants: a decoder either returns a
// message that satisfies everything it promises or throws kvstore::error(errc::protocol) (no
// other exception, no crash, no allocation beyond what the bytes can fill), and whatever it
// returns re-encodes to exactly the input.
#include <kvstore/wire/messages.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

using namespace kvstore;

namespace {

void expect(bool ok) {
  if (!ok) std::abort();
}

void one(int which, std::string_view s) {
  switch (which) {
    case 0: {
      auto m = wire::decode_registration(s);
      expect(m.r == role::worker || m.r == role::server);
      expect(m.host.size() <= wire::max_host_len);
      // Negative hints decode as -1 ("none"): re-encoding is exact for the canonical ones.
      auto e = wire::encode_registration(m);
      expect(e.size() == s.size());
      break;
    }
    case 1: {
      auto b = wire::decode_address_book(s);
      for (std::size_t i = 0; i < b.servers.size(); ++i)
        expect(b.servers[i].rank == static_cast<int>(i));
      expect(wire::encode_address_book(b) == s);
      break;
    }
    case 2: {
      auto es = wire::decode_states(s);
      std::string again;
      std::size_t raw = 0;
      for (auto& e : es) {
        expect(e.lo <= e.hi && e.hi <= e.total && e.nslots <= wire::max_state_slots);
        expect(e.raw.size() == e.nslots * e.slot_bytes());
        for (std::uint32_t i = 0; i < e.nslots; ++i) expect(e.slot(i).size() == e.slot_bytes());
        again += wire::encode_state_head(e.key, e.type, e.lo, e.hi, e.total, e.step, e.nslots);
        again.append(e.raw);
        raw += e.raw.size();
      }
      expect(again == s);
      expect(raw + es.size() * wire::state_head_size == s.size());
      break;
    }
    case 3: {
      auto m = wire::decode_init_meta(s);
      expect(wire::encode_init_meta(m) == s);
      break;
    }
    case 4: {
      auto m = wire::decode_optimizer(s);
      expect(m.name.size() <= wire::max_optimizer_name_len);
      expect(wire::encode_optimizer(m) == s);
      break;
    }
    case 5: {
      auto rows = wire::decode_rows(s);
      expect(wire::encode_rows(rows.data(), rows.size()) == s);
      break;
    }
    case 7: {
      auto m = wire::decode_key_multipliers(s);
      expect(std::isfinite(m.lr_mult) && std::isfinite(m.wd_mult));
      expect(wire::encode_key_multipliers(m) == s);
      break;
    }
    case 8: {
      auto m = wire::decode_range(s);
      expect(m.length > 0 && m.length <= ~std::uint64_t{0} - m.offset);
      expect(wire::encode_range(m) == s);
      break;
    }
    case 9: {  // a batched request's entries: the header's key count and elements, then meta
      if (s.size() < 16) return;
      std::uint64_t keys = 0, elements = 0;
      std::memcpy(&keys, s.data(), 8);
      std::memcpy(&elements, s.data() + 8, 8);
      const std::string_view meta = s.substr(16);
      const auto e = wire::decode_batch(meta, keys, elements);
      expect(e.size() == keys && keys > 0);
      std::uint64_t sum = 0;
      std::string again(meta.size(), '\0');
      for (std::size_t i = 0; i < e.size(); ++i) {
        expect(e[i].elements > 0 && e[i].elements <= elements - sum);
        sum += e[i].elements;
        wire::put_batch_entry(again.data() + i * wire::batch_entry_size, e[i]);
      }
      expect(sum == elements);
      expect(again == meta);
      break;
    }
    default: {  // 6: the primitive reader itself: a script of reads over the bytes
      if (s.empty()) return;
      const auto ops = static_cast<unsigned char>(s[0]);
      wire::meta_reader r(s.substr(1));
      for (int i = 0; i < 8 && !r.done(); ++i) {
        switch ((ops >> (i % 4 * 2)) & 3) {
          case 0:
            r.u32();
            break;
          case 1:
            r.u64();
            break;
          case 2:
            r.str();
            break;
          case 3:
            r.bytes(r.remaining() / 2 + 1);
            break;
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  // An exact-size heap copy, so ASan sees any read past the message.
  std::unique_ptr<char[]> buf(new char[size - 1]);
  if (size > 1) std::memcpy(buf.get(), data + 1, size - 1);
  std::string_view s(buf.get(), size - 1);
  try {
    one(data[0] % 10, s);
  } catch (const error& e) {
    if (e.code() != make_error_code(errc::protocol)) std::abort();
    if (std::string_view(e.what()).empty()) std::abort();
  }
  return 0;
}
