// Mutual authentication of a connection, bound to both ends (protocol v2).
//
//   acceptor  -> connector  challenge: nonce_a (32) | acceptor role (1)
//   connector -> acceptor   auth:      nonce_c (32) | connector role (1) | bind (1) | proof_c (32)
//   acceptor  -> connector  auth:      proof_a (32)        (or a response with auth_failed)
//
// Both proofs are HMAC-SHA256(token, side label || transcript), the transcript holding both
// nonces, both roles and (bind = 1) the connecting side's address and port as both ends see them.
// So: a node without the token can neither log in nor pose as a server or the scheduler (the
// connector checks proof_a before sending anything); a proof cannot be replayed (fresh nonces on
// both sides); and a proof that a relay takes from one connection is refused on another (the
// roles differ, or the relay's own address does). Nothing else is read before the proofs check
// out. OpenSSL's libcrypto does the cryptography.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/transport/hmac.hpp>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvstore::transport {

inline constexpr std::size_t nonce_size = 32;
inline constexpr std::size_t proof_size = hmac_sha256_size;
inline constexpr std::size_t challenge_size = nonce_size + 1;
inline constexpr std::size_t auth_size = nonce_size + 2 + proof_size;

/// A fresh random nonce from the system's CSPRNG.
inline std::string make_nonce() {
  std::string n(nonce_size, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1)
    throw error(errc::auth_failed, "no random bytes for an authentication nonce");
  return n;
}

/// Constant-time equality of two proofs.
inline bool same_proof(std::string_view want, std::string_view got) {
  return want.size() == proof_size && got.size() == proof_size &&
         CRYPTO_memcmp(want.data(), got.data(), proof_size) == 0;
}

/// The acceptor's opening frame.
struct challenge {
  std::string nonce;
  role acceptor = role::server;
};
/// The connector's answer.
struct auth_answer {
  std::string nonce;
  role connector = role::worker;
  bool bind_address = true;
  std::string proof;
};

inline bool valid_role(unsigned v) { return v <= static_cast<unsigned>(role::scheduler); }

inline std::string encode_challenge(const challenge& c) {
  return c.nonce + static_cast<char>(c.acceptor);
}
inline std::optional<challenge> decode_challenge(std::string_view m) {
  if (m.size() != challenge_size || !valid_role(static_cast<unsigned char>(m[nonce_size])))
    return std::nullopt;
  return challenge{std::string(m.substr(0, nonce_size)),
                   static_cast<role>(static_cast<unsigned char>(m[nonce_size]))};
}
inline std::string encode_auth(const auth_answer& a) {
  return a.nonce + static_cast<char>(a.connector) + static_cast<char>(a.bind_address ? 1 : 0) +
         a.proof;
}
inline std::optional<auth_answer> decode_auth(std::string_view m) {
  if (m.size() != auth_size) return std::nullopt;
  const auto r = static_cast<unsigned char>(m[nonce_size]);
  const auto bind = static_cast<unsigned char>(m[nonce_size + 1]);
  if (!valid_role(r) || bind > 1) return std::nullopt;
  return auth_answer{std::string(m.substr(0, nonce_size)), static_cast<role>(r), bind == 1,
                     std::string(m.substr(nonce_size + 2))};
}

/// What both proofs cover: both nonces, both roles, and the connector's address ("" when not
/// bound, or when the socket has no IP address).
inline std::string transcript(const challenge& c, const auth_answer& a,
                              std::string_view connector_address) {
  std::string t = "kvstore auth v2|";
  t += c.nonce;
  t += a.nonce;
  t += static_cast<char>(c.acceptor);
  t += static_cast<char>(a.connector);
  t += static_cast<char>(a.bind_address ? 1 : 0);
  if (a.bind_address) t.append(connector_address);
  return t;
}
inline std::string connector_proof(std::string_view token, std::string_view transcript) {
  return hmac_sha256(token, std::string("connector|").append(transcript));
}
inline std::string acceptor_proof(std::string_view token, std::string_view transcript) {
  return hmac_sha256(token, std::string("acceptor|").append(transcript));
}

/// The connector's answer to challenge `c`: a fresh nonce and the proof over both ends.
inline auth_answer answer_challenge(std::string_view token, const challenge& c, role self,
                                    bool bind_address, std::string_view own_address) {
  auth_answer a{make_nonce(), self, bind_address, {}};
  a.proof = connector_proof(token, transcript(c, a, own_address));
  return a;
}

}  // namespace kvstore::transport
