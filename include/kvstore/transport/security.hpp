// How one connection authenticates and times out: the part of the options the transport reads,
// so transport/ needs nothing else of options.hpp.
#pragma once

#include <kvstore/node.hpp>

#include <chrono>
#include <optional>
#include <string>

namespace kvstore {

/// How one connection authenticates and times out (see transport/tcp_connection.hpp).
struct transport_security {
  std::string token;
  bool acceptor = false;
  /// This node's role, which the handshake proves along with the token.
  kvstore::role self = kvstore::role::worker;
  /// Connector: the role the accepting side must prove (none: any).
  std::optional<kvstore::role> expect_peer;
  std::chrono::milliseconds handshake_timeout{5'000};
  std::chrono::milliseconds idle_timeout{0};
  std::string tls_cert, tls_key, tls_ca;  // TLS when tls_cert is set
  /// The proofs cover the connecting side's address and port (see dist_options).
  bool bind_address = true;
  /// Acceptor: answers queued for the peer above this many bytes pause reading its frames
  /// (0: no bound).
  std::size_t max_queued_bytes = 0;
  /// The socket's congestion control: "auto", "system" or a name (transport/tcp_congestion.hpp;
  /// dist_options::tcp_congestion).
  std::string tcp_congestion = "auto";
};

}  // namespace kvstore
