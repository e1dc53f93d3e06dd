// Saving and loading the optimizer states of a whole store (KVStore::save_optimizer_states /
// load_optimizer_states). The file is trusted local data (so Boost.Serialization is allowed),
// but it may be truncated, corrupted or from another run: everything is checked before use.
//
// Layout, integers little-endian:
//   magic "KVSTOPT\0" (8) | format version u32 | element size u8 | element is float u8 |
//   reserved u16 (0) | optimizer name length u32 | name | payload length u64 | payload CRC-32 u32 |
//   payload: boost::archive::binary_oarchive of std::map<std::uint64_t, key_state<T>>
// The payload is in the machine's native binary format: a state file is for the machine (or an
// identical one) that wrote it.
#pragma once

#include <kvstore/detail/atomic_file.hpp>
#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/optim/optimizer.hpp>
#include <kvstore/optim/state_serialization.hpp>

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/map.hpp>
#include <boost/serialization/split_member.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/utility.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <type_traits>

namespace kvstore::optim {

/// The optimizer state of one key, with the key's name (empty for an integer key) so a loaded
/// file can be checked against the store's keys.
template <class T>
struct key_state {
  std::string name;
  state<T> st;

  template <class Ar>
  void save(Ar& ar, unsigned /*version*/) const {
    ar& name& st;
  }
  template <class Ar>
  void load(Ar& ar, unsigned /*version*/) {
    // The name as Boost stores a std::string (length, then bytes), read by hand so a corrupt
    // length is refused instead of allocated (found by fuzz/fuzz_state_file.cpp).
    std::size_t n = 0;
    ar& n;
    kvstore::detail::check_decodable(n, "key name");
    name.resize(n);
    if (n) ar.load_binary(name.data(), n);
    ar& st;
  }
  BOOST_SERIALIZATION_SPLIT_MEMBER()
};

}  // namespace kvstore::optim

namespace kvstore::detail {

inline constexpr char state_file_magic[8] = {'K', 'V', 'S', 'T', 'O', 'P', 'T', '\0'};
inline constexpr std::uint32_t state_file_version = 2;  // 2: explicit slot lengths
/// Optimizer names are short; a larger length field means a corrupt file, not a real name.
inline constexpr std::uint32_t state_file_max_name = 4096;

template <class U>
void put_le(std::string& out, U v) {
  for (std::size_t i = 0; i < sizeof(U); ++i)
    out.push_back(static_cast<char>(static_cast<unsigned char>(v >> (8 * i))));
}

/// Reads a file from memory front to back; `take` fails (returns false) past the end instead of
/// reading garbage.
struct byte_reader {
  std::string_view rest;

  bool take(std::size_t n, std::string_view& out) {
    if (rest.size() < n) return false;
    out = rest.substr(0, n);
    rest.remove_prefix(n);
    return true;
  }
  template <class U>
  bool get_le(U& v) {
    std::string_view b;
    if (!take(sizeof(U), b)) return false;
    v = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i)
      v |= static_cast<U>(static_cast<U>(static_cast<unsigned char>(b[i])) << (8 * i));
    return true;
  }
};

/// A read-only streambuf over bytes already in memory, so the archive reads the payload without
/// a copy.
class memory_streambuf : public std::streambuf {
 public:
  explicit memory_streambuf(std::string_view s) {
    char* p = const_cast<char*>(s.data());  // never written: get area only
    setg(p, p, p + s.size());
  }
};

}  // namespace kvstore::detail

namespace kvstore::optim {

/// Writes the optimizer states of a store to `path` atomically (see write_file_atomically): the
/// file is replaced whole or not at all. `optimizer_name` is the registered name of the store's
/// optimizer, checked again on load. Throws kvstore::error(io_error) when the file cannot be
/// written, kvstore::error(invalid_argument) for an optimizer name over 4096 bytes.
template <class T>
void save_states(const std::filesystem::path& path, std::string_view optimizer_name,
                 const std::map<std::uint64_t, key_state<T>>& states) {
  static_assert(std::is_arithmetic_v<T>, "optimizer states hold arithmetic elements");
  if (optimizer_name.size() > kvstore::detail::state_file_max_name)
    throw kvstore::error(errc::invalid_argument,
                         "optimizer state file '" + path.string() + "': optimizer name too long");
  std::stringbuf payload_buf;
  {
    boost::archive::binary_oarchive oa(payload_buf);
    oa << states;
  }
  const std::string payload = std::move(payload_buf).str();

  using kvstore::detail::put_le;
  std::string out;
  out.reserve(40 + optimizer_name.size() + payload.size());
  out.append(kvstore::detail::state_file_magic, sizeof kvstore::detail::state_file_magic);
  put_le<std::uint32_t>(out, kvstore::detail::state_file_version);
  put_le<std::uint8_t>(out, sizeof(T));
  put_le<std::uint8_t>(out, std::is_floating_point_v<T> ? 1 : 0);
  put_le<std::uint16_t>(out, 0);
  put_le<std::uint32_t>(out, static_cast<std::uint32_t>(optimizer_name.size()));
  out.append(optimizer_name);
  put_le<std::uint64_t>(out, payload.size());
  put_le<std::uint32_t>(out, kvstore::detail::checksum(payload));
  out.append(payload);
  kvstore::detail::write_file_atomically(path, out);
}

/// Parses the bytes of a state file (load_states without the file; what fuzz/fuzz_state_file.cpp
/// feeds). `source` names the bytes in errors. Same checks and errors as load_states.
template <class T>
std::map<std::uint64_t, key_state<T>> parse_states(std::string_view bytes,
                                                   std::string_view expected_optimizer_name,
                                                   std::string_view source = "<memory>",
                                                   std::string* saved_for = nullptr) {
  static_assert(std::is_arithmetic_v<T>, "optimizer states hold arithmetic elements");
  auto bad = [&](const std::string& what) {
    return kvstore::error(errc::bad_file,
                          "optimizer state file '" + std::string(source) + "': " + what);
  };
  kvstore::detail::byte_reader r{bytes};
  std::string_view magic;
  if (!r.take(sizeof kvstore::detail::state_file_magic, magic) ||
      std::memcmp(magic.data(), kvstore::detail::state_file_magic, magic.size()) != 0)
    throw bad("not an optimizer state file (wrong magic)");
  std::uint32_t version = 0;
  if (!r.get_le(version)) throw bad("truncated header");
  if (version != kvstore::detail::state_file_version)
    throw bad("unsupported format version " + std::to_string(version) + " (expected " +
              std::to_string(kvstore::detail::state_file_version) + ")");
  std::uint8_t size = 0, is_float = 0;
  std::uint16_t reserved = 0;
  std::uint32_t name_len = 0;
  if (!r.get_le(size) || !r.get_le(is_float) || !r.get_le(reserved) || !r.get_le(name_len))
    throw bad("truncated header");
  const bool want_float = std::is_floating_point_v<T>;
  if (size != sizeof(T) || is_float != (want_float ? 1 : 0))
    throw bad("element type is " + std::string(is_float ? "floating-point" : "integer") + " of " +
              std::to_string(size) + " bytes, the store's is " +
              std::string(want_float ? "floating-point" : "integer") + " of " +
              std::to_string(sizeof(T)) + " bytes");
  if (reserved != 0) throw bad("corrupt header");
  if (name_len > kvstore::detail::state_file_max_name) throw bad("corrupt header (name length)");
  std::string_view name;
  if (!r.take(name_len, name)) throw bad("truncated header");
  if (saved_for)
    *saved_for = name;  // the caller checks it (load_states_any)
  else if (name != expected_optimizer_name)
    throw bad("saved for optimizer \"" + std::string(name) + "\", the store's optimizer is \"" +
              std::string(expected_optimizer_name) + "\"");
  std::uint64_t payload_len = 0;
  std::uint32_t crc = 0;
  if (!r.get_le(payload_len) || !r.get_le(crc)) throw bad("truncated header");
  if (r.rest.size() < payload_len)
    throw bad("truncated: " + std::to_string(r.rest.size()) + " of " + std::to_string(payload_len) +
              " payload bytes");
  if (r.rest.size() > payload_len) throw bad("unexpected bytes after the payload");
  if (kvstore::detail::checksum(r.rest) != crc) throw bad("checksum mismatch (corrupt file)");

  // Boost's archive header opens with its signature as a length-prefixed string, which Boost
  // allocates before reading: check it here, so a corrupt length is refused, not allocated.
  {
    std::string sig;
    kvstore::detail::put_le<std::uint64_t>(sig, 22);
    sig += "serialization::archive";
    if (r.rest.substr(0, sig.size()) != sig)
      throw bad("cannot decode the payload: not a Boost binary archive");
  }
  std::map<std::uint64_t, key_state<T>> states;
  try {
    kvstore::detail::memory_streambuf buf(r.rest);
    struct scope {
      explicit scope(std::streambuf* b) { kvstore::detail::state_decoding_from = b; }
      ~scope() { kvstore::detail::state_decoding_from = nullptr; }
    } s(&buf);
    boost::archive::binary_iarchive ia(buf);
    ia >> states;
  } catch (const std::exception& e) {
    throw bad(std::string("cannot decode the payload: ") + e.what());
  }
  // A well-formed archive can still disagree with itself; the store relies on these.
  for (const auto& [id, ks] : states) {
    const auto& slots = ks.st.slots;
    for (const auto& s : slots)
      if (s.size() != slots.front().size())
        throw bad("slots of key " + std::to_string(id) + " differ in size");
    if (slots.size() > static_cast<std::size_t>(max_slots))
      throw bad("key " + std::to_string(id) + " has " + std::to_string(slots.size()) +
                " slots, at most " + std::to_string(max_slots) + " exist");
    if (!ks.name.empty() && key::hash(ks.name) != id)
      throw bad("key name \"" + ks.name + "\" does not match its id " + std::to_string(id));
  }
  return states;
}

/// Reads the optimizer states saved by save_states<T>. Everything is validated before the map is
/// returned, and nothing the caller holds is touched, so a failed load changes nothing.
/// Throws kvstore::error(io_error) when the file cannot be read, and
/// kvstore::error(bad_file, "optimizer state file '<path>': <problem>") when it is not a state
/// file, is of another version or element type, was saved for another optimizer than
/// `expected_optimizer_name`, is truncated or corrupt.
template <class T>
std::map<std::uint64_t, key_state<T>> load_states(const std::filesystem::path& path,
                                                  std::string_view expected_optimizer_name) {
  const std::string bytes = kvstore::detail::read_file(
      path, {kvstore::detail::state_file_magic, sizeof kvstore::detail::state_file_magic});
  return parse_states<T>(bytes, expected_optimizer_name, path.string());
}

/// load_states for a caller that checks the optimizer elsewhere (a dist worker: its servers
/// know which optimizer they run): the file's optimizer name goes to `saved_for`.
template <class T>
std::map<std::uint64_t, key_state<T>> load_states_any(const std::filesystem::path& path,
                                                      std::string& saved_for) {
  const std::string bytes = kvstore::detail::read_file(
      path, {kvstore::detail::state_file_magic, sizeof kvstore::detail::state_file_magic});
  return parse_states<T>(bytes, {}, path.string(), &saved_for);
}

}  // namespace kvstore::optim
