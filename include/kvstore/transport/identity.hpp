// Who a worker is, proven on each connection. At gather the scheduler draws a random 32-byte job
// secret; it sends the secret to every server and to each worker only that worker's credential,
// HMAC-SHA256(job secret, "kvstore node credential v1" || node id). A worker's hello to a server
// carries HMAC-SHA256(credential, "kvstore hello v1" || connection binding || server node id ||
// worker rank): it names this connection (its handshake's binding), this server and this rank,
// so it cannot be replayed elsewhere, and only the holder of that worker's credential (or of the
// job secret) can make it. Integers are 8 bytes, little-endian. OpenSSL's libcrypto does the
// cryptography.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/transport/hmac.hpp>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace kvstore::transport {

/// Bytes of a job secret, of a credential and of a hello proof.
inline constexpr std::size_t identity_size = hmac_sha256_size;

namespace identity_impl {
inline void append_le64(std::string& s, std::int64_t v) {
  auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
}  // namespace identity_impl

/// A fresh job secret from the system's CSPRNG.
inline std::string make_job_secret() {
  std::string s(identity_size, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(s.size())) != 1)
    throw error(errc::auth_failed, "no random bytes for the job secret");
  return s;
}

/// Node `node_id`'s credential under `job_secret`.
inline std::string node_credential(std::string_view job_secret, int node_id) {
  static constexpr std::string_view label = "kvstore node credential v1";
  std::string msg(label);
  identity_impl::append_le64(msg, node_id);
  return hmac_sha256(job_secret, msg);
}

/// The proof a worker of rank `rank` puts in its hello to server `server_id` on the connection
/// whose binding is `binding` (opaque bytes, identical on both ends).
inline std::string hello_proof(std::string_view credential, std::string_view binding, int server_id,
                               int rank) {
  static constexpr std::string_view label = "kvstore hello v1";
  std::string msg(label);
  msg.append(binding);
  identity_impl::append_le64(msg, server_id);
  identity_impl::append_le64(msg, rank);
  return hmac_sha256(credential, msg);
}

/// A server's constant-time check of a hello claiming worker node `worker_id` of rank `rank`.
inline bool check_hello_proof(std::string_view job_secret, int worker_id, int rank,
                              std::string_view binding, int server_id, std::string_view proof) {
  if (proof.size() != identity_size || job_secret.size() != identity_size) return false;
  const std::string want =
      hello_proof(node_credential(job_secret, worker_id), binding, server_id, rank);
  return CRYPTO_memcmp(want.data(), proof.data(), identity_size) == 0;
}

}  // namespace kvstore::transport
