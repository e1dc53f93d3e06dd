// libFuzzer target: the optimizer-state file loader, optim::parse_states<float/double> (what
// load_states runs on a file's bytes). First input byte: bit 0 picks float or double; bit 1
// wraps the rest in a valid header (magic, version, element type, optimizer name "sgd", length
// and CRC-32 computed here) so the fuzzer reaches the Boost.Serialization payload decoder and the
// consistency checks behind the checksum; otherwise the rest is the whole file.
// Invariants: a load either returns states that satisfy every documented check or throws
// kvstore::error(bad_file); nothing else escapes and nothing crashes.
#include <kvstore/fwd.hpp>
#include <kvstore/optim/state_file.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

using namespace kvstore;

namespace {

template <class T>
std::string wrap(std::string_view payload) {
  using kvstore::detail::put_le;
  std::string out(kvstore::detail::state_file_magic, sizeof kvstore::detail::state_file_magic);
  put_le<std::uint32_t>(out, kvstore::detail::state_file_version);
  put_le<std::uint8_t>(out, sizeof(T));
  put_le<std::uint8_t>(out, 1);
  put_le<std::uint16_t>(out, 0);
  put_le<std::uint32_t>(out, 3);
  out += "sgd";
  put_le<std::uint64_t>(out, payload.size());
  put_le<std::uint32_t>(out, kvstore::detail::checksum(payload));
  out.append(payload);
  return out;
}

template <class T>
void load(std::string_view file) {
  // An exact-size heap copy, so ASan sees any read past the end.
  std::unique_ptr<char[]> buf(new char[file.size()]);
  if (!file.empty()) std::memcpy(buf.get(), file.data(), file.size());
  try {
    auto states = optim::parse_states<T>(std::string_view(buf.get(), file.size()), "sgd", "fuzz");
    for (const auto& [id, ks] : states) {
      if (ks.st.slots.size() > static_cast<std::size_t>(optim::max_slots)) std::abort();
      for (const auto& s : ks.st.slots)
        if (s.size() != ks.st.slots.front().size()) std::abort();
      if (!ks.name.empty() && key::hash(ks.name) != id) std::abort();
    }
  } catch (const error& e) {
    if (e.code() != make_error_code(errc::bad_file)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > (1 << 20)) return 0;
  const std::uint8_t mode = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode & 2) {
    if (mode & 1)
      load<double>(wrap<double>(rest));
    else
      load<float>(wrap<float>(rest));
  } else {
    if (mode & 1)
      load<double>(rest);
    else
      load<float>(rest);
  }
  return 0;
}
