// Optional TLS for every connection (asio::ssl over OpenSSL): certificate and key files, a CA
// file, and peer verification on both sides (mutual TLS). The kvstore token handshake still runs
// inside the TLS channel.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/transport/security.hpp>

#include <boost/asio/ssl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

namespace kvstore::transport {

namespace ssl = boost::asio::ssl;

/// The TLS context for connections this node accepts or opens, built once per settings and
/// cached. Null when TLS is off (no certificate given). Throws kvstore::error naming the file that
/// cannot be used.
inline std::shared_ptr<ssl::context> tls_context(const transport_security& s) {
  if (s.tls_cert.empty()) return nullptr;
  static std::mutex m;
  static std::map<std::tuple<std::string, std::string, std::string, bool>,
                  std::shared_ptr<ssl::context>>
      cache;
  std::lock_guard lk(m);
  auto key = std::make_tuple(s.tls_cert, s.tls_key, s.tls_ca, s.acceptor);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto ctx = std::make_shared<ssl::context>(s.acceptor ? ssl::context::tls_server
                                                       : ssl::context::tls_client);
  auto step = [&](const char* what, const std::string& file, auto&& f) {
    boost::system::error_code ec;
    f(ec);
    if (ec)
      throw error(errc::invalid_argument,
                  std::string("TLS ") + what + " '" + file + "': " + ec.message());
  };
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  step("certificate", s.tls_cert,
       [&](auto& ec) { ctx->use_certificate_chain_file(s.tls_cert, ec); });
  step("key", s.tls_key,
       [&](auto& ec) { ctx->use_private_key_file(s.tls_key, ssl::context::pem, ec); });
  if (s.tls_ca.empty())
    throw error(errc::invalid_argument, "TLS needs a CA file to verify peers (KVSTORE_TLS_CA)");
  step("CA", s.tls_ca, [&](auto& ec) { ctx->load_verify_file(s.tls_ca, ec); });
  ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  cache.emplace(key, ctx);
  return ctx;
}

}  // namespace kvstore::transport
