// The token handshake's rules, apart from the socket: what each end sends, what it accepts, and
// when the peer counts as proven. transport/tcp_connection.hpp reads and writes and acts
// on each step; transport/auth.hpp holds the frames' encoding and the proofs.
//
// The acceptor challenges (its nonce and role); the connector answers (its nonce, role and a
// proof over both nonces, both roles and its address); the acceptor checks the proof and sends
// its own over the same transcript, which the connector checks. Each end proves the peer before
// it sends anything of its own beyond these frames.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/transport/auth.hpp>
#include <kvstore/transport/security.hpp>
#include <kvstore/wire/frame.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace kvstore::transport {

class token_handshake {
 public:
  /// What the connection does after a frame of the handshake.
  struct step {
    std::string fail;    ///< not empty: close with this reason
    std::string refuse;  ///< not empty: tell the peer auth_failed, then close with this reason
    bool send = false;   ///< write one handshake frame: `cmd` with meta `meta`
    wire::cmd cmd = wire::cmd::response;
    std::string meta;
    bool proven = false;  ///< the peer proved the token: frames of this end may follow the send
  };

  /// `remote` names the peer in errors ("ip:port").
  /// `sec` is read as the handshake goes, so it must outlive this (the connection's own).
  token_handshake(const transport_security& sec, std::string remote)
      : sec_(sec), remote_(std::move(remote)) {}
  token_handshake(const transport_security&& sec, std::string remote) = delete;

  /// The largest meta a handshake frame of the peer may carry.
  std::size_t max_meta() const {
    return sec_.acceptor ? auth_size : std::max(challenge_size, proof_size);
  }

  /// The acceptor's opening frame (its challenge); the connector sends nothing first.
  step start() {
    if (!sec_.acceptor) return {};
    challenge_ = {make_nonce(), sec_.self};
    return sending(wire::cmd::challenge, encode_challenge(challenge_));
  }

  /// A frame from the peer before it is proven. `connector_address` is the connector's address
  /// as this end sees it ("" when the socket has none), which the proofs cover.
  step on_frame(const wire::header& h, const std::string& meta,
                const std::string& connector_address) {
    return sec_.acceptor ? on_answer(h, meta, connector_address)
                         : on_acceptor_frame(h, meta, connector_address);
  }

  /// Once proven: the role the peer proved, and what binds later proofs to this connection
  /// (both nonces; transport::hello_proof).
  kvstore::role peer_role() const noexcept { return peer_role_; }
  const std::string& binding() const noexcept { return binding_; }

 private:
  static step failed(std::string why) {
    step s;
    s.fail = std::move(why);
    return s;
  }
  static step refused(std::string why) {
    step s;
    s.refuse = std::move(why);
    return s;
  }
  static step sending(wire::cmd c, std::string meta) {
    step s;
    s.send = true;
    s.cmd = c;
    s.meta = std::move(meta);
    return s;
  }
  // The peer proved the token as `r`; later proofs bind to both ends' nonces.
  void proven_as(kvstore::role r, const std::string& connector_nonce) {
    binding_ = challenge_.nonce + connector_nonce;
    peer_role_ = r;
  }
  static bool is_refusal(const wire::header& h) {
    return h.command == wire::cmd::response &&
           h.status == static_cast<std::uint32_t>(errc::auth_failed);
  }

  // Acceptor: the connector's answer to the challenge.
  step on_answer(const wire::header& h, const std::string& meta, const std::string& address) {
    if (h.command != wire::cmd::auth) return failed("unauthenticated frame before the token proof");
    const auto a = decode_auth(meta);
    if (!a) return failed("malformed authentication frame");
    if (sec_.bind_address && !a->bind_address)
      return refused("the peer's proof does not cover its address (KVSTORE_AUTH_BIND_ADDRESS)");
    const std::string t = transcript(challenge_, *a, address);
    if (!same_proof(connector_proof(sec_.token, t), a->proof))
      return refused("authentication failed (wrong token, or a proof relayed from elsewhere)");
    proven_as(a->connector, a->nonce);
    // Our proof goes out before any frame of ours.
    step s = sending(wire::cmd::auth, acceptor_proof(sec_.token, t));
    s.proven = true;
    return s;
  }

  // Connector: the challenge, then the acceptor's proof.
  step on_acceptor_frame(const wire::header& h, const std::string& meta,
                         const std::string& address) {
    if (is_refusal(h)) return failed("the peer refused this node's token (KVSTORE_TOKEN differs)");
    if (!answer_) {
      const auto c = h.command == wire::cmd::challenge ? decode_challenge(meta) : std::nullopt;
      if (!c) return failed("expected the peer's challenge first");
      if (sec_.expect_peer && c->acceptor != *sec_.expect_peer)
        return failed(std::string("the peer says it is a ") + detail::role_name(c->acceptor) +
                      ", not the " + detail::role_name(*sec_.expect_peer) + " this node dialed");
      challenge_ = *c;
      answer_ = answer_challenge(sec_.token, *c, sec_.self, sec_.bind_address, address);
      return sending(wire::cmd::auth, encode_auth(*answer_));
    }
    // The acceptor's proof: until it checks out, nothing of this node's is sent.
    if (h.command != wire::cmd::auth ||
        !same_proof(acceptor_proof(sec_.token, transcript(challenge_, *answer_, address)), meta))
      return failed(std::string("the ") + detail::role_name(challenge_.acceptor) + " at " +
                    remote_ +
                    " could not prove the token: not a node of this job (KVSTORE_TOKEN differs, "
                    "or something else answers there)");
    proven_as(challenge_.acceptor, answer_->nonce);
    step s;
    s.proven = true;
    return s;
  }

  const transport_security& sec_;
  std::string remote_;
  challenge challenge_;                // acceptor: the one it sent; connector: the one it got
  std::optional<auth_answer> answer_;  // connector: what it sent
  std::string binding_;
  kvstore::role peer_role_ = kvstore::role::worker;
};

}  // namespace kvstore::transport
