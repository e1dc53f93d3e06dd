// Authentication of a connection: the accepting side sends a random 32-byte nonce; the
// connecting side answers HMAC-SHA256(token, "kvstore auth v1" || nonce); the acceptor compares
// in constant time. Nothing else is read before that. OpenSSL's libcrypto does the cryptography.
#pragma once

#include <kvstore/error.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <string>
#include <string_view>

namespace kvstore::transport {

inline constexpr std::size_t nonce_size = 32;
inline constexpr std::size_t proof_size = 32;

/// A fresh random nonce from the system's CSPRNG.
inline std::string make_nonce() {
  std::string n(nonce_size, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1)
    throw error(errc::auth_failed, "no random bytes for an authentication nonce");
  return n;
}

/// The proof of knowing `token` for this nonce.
inline std::string make_proof(std::string_view token, std::string_view nonce) {
  static constexpr std::string_view label = "kvstore auth v1";
  std::string msg;
  msg.reserve(label.size() + nonce.size());
  msg.append(label).append(nonce);
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int len = 0;
  // An empty token still makes a (well-known) proof: the protocol is the same with and without
  // one, and a node with a token refuses a peer without it.
  static const unsigned char empty = 0;
  const void* key =
      token.empty() ? static_cast<const void*>(&empty) : static_cast<const void*>(token.data());
  if (!HMAC(EVP_sha256(), key, static_cast<int>(token.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len) ||
      len != proof_size)
    throw error(errc::auth_failed, "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(out.data()), len);
}

/// Constant-time check of a peer's proof.
inline bool check_proof(std::string_view token, std::string_view nonce, std::string_view proof) {
  if (proof.size() != proof_size) return false;
  const std::string want = make_proof(token, nonce);
  return CRYPTO_memcmp(want.data(), proof.data(), proof_size) == 0;
}

}  // namespace kvstore::transport
