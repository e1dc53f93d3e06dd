// HMAC-SHA256, the one MAC of the transport: the handshake's proofs (auth.hpp) and the workers'
// credentials and hello proofs (identity.hpp). OpenSSL's libcrypto does the cryptography.
#pragma once

#include <kvstore/error.hpp>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace kvstore::transport {

/// Bytes of an HMAC-SHA256.
inline constexpr std::size_t hmac_sha256_size = 32;

/// HMAC-SHA256(key, msg): hmac_sha256_size bytes. Throws error(errc::auth_failed) if libcrypto
/// fails.
inline std::string hmac_sha256(std::string_view key, std::string_view msg) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int len = 0;
  // An empty key still makes a (well-known) MAC: the handshake is the same with and without a
  // token, and a node with a token refuses a peer without it.
  static const unsigned char empty = 0;
  const void* k =
      key.empty() ? static_cast<const void*>(&empty) : static_cast<const void*>(key.data());
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len) ||
      len != hmac_sha256_size)
    throw error(errc::auth_failed, "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(out.data()), len);
}

}  // namespace kvstore::transport
