// transport/handshake.hpp: the token handshake's rules without a socket. Two ends exchange their
// frames in memory; each test checks what each end decides: proven (and as what role, with the
// same binding on both ends), refused, or failed with a reason that names the problem.
#include <kvstore/transport/handshake.hpp>  // first: the header is self-contained

#include <doctest/doctest.h>

#include <optional>
#include <string>

using kvstore::role;
using kvstore::transport_security;
using kvstore::transport::token_handshake;
namespace wire = kvstore::wire;

namespace {

transport_security acceptor_of(std::string token, role self = role::server) {
  transport_security s;
  s.token = std::move(token);
  s.acceptor = true;
  s.self = self;
  return s;
}
transport_security connector_of(std::string token, role self = role::worker,
                                std::optional<role> expect = role::server) {
  transport_security s;
  s.token = std::move(token);
  s.self = self;
  s.expect_peer = expect;
  return s;
}

wire::header header_of(wire::cmd c) {
  wire::header h;
  h.command = c;
  return h;
}

// What the acceptor sees as the connector's address, and what the connector sees as its own.
const std::string address = "127.0.0.1:40000";

// Runs the exchange up to where one end stops; returns the last step of each end.
struct exchange {
  transport_security a_sec, c_sec;
  token_handshake acceptor{a_sec, "127.0.0.1:40001"};
  token_handshake connector{c_sec, "127.0.0.1:7000"};
  token_handshake::step a_last, c_last;

  exchange(transport_security a, transport_security c) : a_sec(std::move(a)), c_sec(std::move(c)) {}

  void run(const std::string& acceptor_sees = address,
           const std::string& connector_sees = address) {
    CHECK(connector.start().send == false);  // the connector speaks second
    const auto hello = acceptor.start();
    REQUIRE(hello.send);
    REQUIRE(hello.cmd == wire::cmd::challenge);
    CHECK(hello.meta.size() <= connector.max_meta());
    c_last = connector.on_frame(header_of(hello.cmd), hello.meta, connector_sees);
    if (!c_last.send) return;
    CHECK(c_last.cmd == wire::cmd::auth);
    CHECK(c_last.meta.size() <= acceptor.max_meta());
    a_last = acceptor.on_frame(header_of(c_last.cmd), c_last.meta, acceptor_sees);
    if (!a_last.send) return;
    c_last = connector.on_frame(header_of(a_last.cmd), a_last.meta, connector_sees);
  }
};

}  // namespace

TEST_CASE("the same token: both ends proven, each knows the other's role, one binding") {
  exchange x(acceptor_of("s3cret"), connector_of("s3cret"));
  x.run();
  CHECK(x.a_last.proven);
  CHECK(x.a_last.fail.empty());
  CHECK(x.a_last.refuse.empty());
  CHECK(x.a_last.cmd == wire::cmd::auth);  // the acceptor's proof goes out first
  CHECK(x.c_last.proven);
  CHECK_FALSE(x.c_last.send);
  CHECK(x.acceptor.peer_role() == role::worker);
  CHECK(x.connector.peer_role() == role::server);
  CHECK(x.acceptor.binding().size() == 2 * kvstore::transport::nonce_size);
  CHECK(x.acceptor.binding() == x.connector.binding());

  // A second handshake binds to other nonces.
  exchange y(acceptor_of("s3cret"), connector_of("s3cret"));
  y.run();
  REQUIRE(y.c_last.proven);
  CHECK(y.acceptor.binding() != x.acceptor.binding());
}

TEST_CASE("a wrong token: the acceptor refuses and the connector learns nothing of its token") {
  exchange x(acceptor_of("s3cret"), connector_of("guess"));
  x.run();
  CHECK_FALSE(x.a_last.proven);
  CHECK_FALSE(x.a_last.send);
  CHECK(x.a_last.refuse.find("authentication failed") != std::string::npos);
  // The refusal as the connector reads it.
  wire::header r = header_of(wire::cmd::response);
  r.status = static_cast<std::uint32_t>(kvstore::errc::auth_failed);
  const auto c = x.connector.on_frame(r, {}, address);
  CHECK_FALSE(c.proven);
  CHECK(c.fail.find("the peer refused this node's token") != std::string::npos);
}

TEST_CASE("a proof made for another address is refused (a relayed answer)") {
  exchange x(acceptor_of("s3cret"), connector_of("s3cret"));
  x.run(/*acceptor_sees=*/"10.0.0.9:40000", /*connector_sees=*/address);
  CHECK_FALSE(x.a_last.proven);
  CHECK(x.a_last.refuse.find("relayed") != std::string::npos);
}

TEST_CASE("an acceptor that does not know the token cannot prove itself to the connector") {
  exchange x(acceptor_of("other"), connector_of("s3cret"));
  // The acceptor refuses the connector's proof; an impostor that answers anyway with a proof
  // of its own making is caught by the connector.
  x.run();
  CHECK_FALSE(x.a_last.proven);
  const auto c = x.connector.on_frame(header_of(wire::cmd::auth), std::string(32, 'x'), address);
  CHECK_FALSE(c.proven);
  CHECK(c.fail.find("could not prove the token") != std::string::npos);
  CHECK(c.fail.find("127.0.0.1:7000") != std::string::npos);  // names the peer
}

TEST_CASE("the connector fails when the peer is not the role it dialed") {
  exchange x(acceptor_of("s3cret", role::worker),
             connector_of("s3cret", role::worker, role::server));
  x.run();
  CHECK_FALSE(x.c_last.send);
  CHECK(x.c_last.fail.find("says it is a worker, not the server") != std::string::npos);
}

TEST_CASE("frames out of turn or malformed fail the handshake") {
  SUBCASE("acceptor: anything but the answer") {
    transport_security as = acceptor_of("t");
    token_handshake b(as, "peer");
    (void)b.start();
    auto s = b.on_frame(header_of(wire::cmd::push), {}, address);
    CHECK(s.fail.find("unauthenticated frame") != std::string::npos);
    s = b.on_frame(header_of(wire::cmd::auth), "short", address);
    CHECK(s.fail.find("malformed") != std::string::npos);
    CHECK_FALSE(s.proven);
  }
  SUBCASE("connector: a proof before the challenge, or a garbled challenge") {
    transport_security cs = connector_of("t");
    token_handshake c(cs, "peer");
    auto s = c.on_frame(header_of(wire::cmd::auth), std::string(32, 'p'), address);
    CHECK(s.fail.find("expected the peer's challenge first") != std::string::npos);
    s = c.on_frame(header_of(wire::cmd::challenge), "no", address);
    CHECK(s.fail.find("expected the peer's challenge first") != std::string::npos);
    CHECK_FALSE(s.proven);
  }
}

TEST_CASE("an answer whose proof does not cover its address is refused where binding is on") {
  transport_security unbound = connector_of("s3cret");
  unbound.bind_address = false;
  exchange x(acceptor_of("s3cret"), unbound);
  x.run();
  CHECK_FALSE(x.a_last.proven);
  CHECK(x.a_last.refuse.find("KVSTORE_AUTH_BIND_ADDRESS") != std::string::npos);

  // With binding off on both ends the same exchange proves both.
  transport_security a = acceptor_of("s3cret");
  a.bind_address = false;
  transport_security c = connector_of("s3cret");
  c.bind_address = false;
  exchange y(a, c);
  y.run("10.0.0.9:1", "127.0.0.1:2");  // addresses differ: not covered, so not checked
  CHECK(y.a_last.proven);
  CHECK(y.c_last.proven);
}
