// kvstore::error: the one exception type every misuse and failure surfaces as.
#pragma once

#include <stdexcept>
#include <string>
#include <system_error>

namespace kvstore {

/// What went wrong, as an error_code value (category: kvstore::category()).
enum class errc {
  ok = 0,
  unknown_key = 1,   ///< push/pull of a key never inited
  size_mismatch,     ///< a value whose size differs from the key's
  already_inited,    ///< init of a key twice
  row_out_of_range,  ///< a row index outside the key's matrix
  not_a_matrix,      ///< row op on a key inited without a row length
  invalid_argument,  ///< any other bad argument
  bad_file,          ///< a wrong, truncated or corrupt file
  io_error,          ///< a file could not be read or written
  unreachable,       ///< a node could not be reached
  timeout,           ///< a deadline passed
  protocol,          ///< a peer sent something that breaks the wire rules
  auth_failed,       ///< a peer failed authentication
  node_dead,         ///< a node died or left
  server_error,      ///< a server refused the request
  shutdown,          ///< the store or a node is shutting down
  unsupported,       ///< the call is not available in this mode
  device_error,      ///< a device (CUDA) call failed, or memory is not on the device stated
};

namespace detail {
class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "kvstore"; }
  std::string message(int c) const override {
    switch (static_cast<errc>(c)) {
      case errc::ok:
        return "ok";
      case errc::unknown_key:
        return "unknown key";
      case errc::size_mismatch:
        return "size mismatch";
      case errc::already_inited:
        return "key already inited";
      case errc::row_out_of_range:
        return "row out of range";
      case errc::not_a_matrix:
        return "key is not a matrix";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::bad_file:
        return "bad file";
      case errc::io_error:
        return "i/o error";
      case errc::unreachable:
        return "node unreachable";
      case errc::timeout:
        return "deadline passed";
      case errc::protocol:
        return "protocol violation";
      case errc::auth_failed:
        return "authentication failed";
      case errc::node_dead:
        return "node dead";
      case errc::server_error:
        return "server error";
      case errc::shutdown:
        return "shut down";
      case errc::unsupported:
        return "unsupported";
      case errc::device_error:
        return "device error";
    }
    return "unknown kvstore error";
  }
};
}  // namespace detail

inline const std::error_category& category() noexcept {
  static const detail::error_category_impl c;
  return c;
}

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), category()};
}

/// The exception thrown for every misuse and failure. what() names the key (where there is one)
/// and the problem; code() classifies it.
class error : public std::runtime_error {
 public:
  error(errc code, const std::string& what)
      : std::runtime_error(what), code_(make_error_code(code)) {}
  std::error_code code() const noexcept { return code_; }

 private:
  std::error_code code_;
};

}  // namespace kvstore

template <>
struct std::is_error_code_enum<kvstore::errc> : std::true_type {};
