// libFuzzer target: an authenticated peer's frames into a real kvstore::server (init, push, pull,
// rows, optimizers, state transfer: everything a worker can ask), over the real connection. The
// server is fresh for every input and its frame handler runs on this thread; it is never
// registered with a scheduler (it is given a job secret instead). First input byte: bit 0
// dist_sync or dist_async, bit 1 one or two workers, bit 2 sends the hello (worker rank 0, with
// its identity proof for this connection) for the fuzzer, bit 3 staleness 0 (pulls held for
// slower workers; pulls with a min version are held in every mode). The rest is the byte stream
// after the token proof. Invariants: no crash, no hang, the connection ends closed, and memory
// stays bounded (libFuzzer's -rss_limit_mb / -malloc_limit_mb).
#include "conn_harness.hpp"

#include <kvstore/server/server.hpp>
#include <kvstore/transport/identity.hpp>
#include <kvstore/wire/frame.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

using namespace kvstore;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > (256 << 10)) return 0;
  const std::uint8_t mode = data[0];
  ++data;
  --size;

  dist_options o;
  o.role = role::server;
  o.num_workers = (mode & 2) ? 2 : 1;
  o.sync = !(mode & 1);
  if (mode & 8) o.staleness = 0;
  o.token = fuzz::token;
  o.bind_host = "127.0.0.1";
  o.max_frame_bytes = 1 << 20;
  o.max_key_bytes = 64 << 20;  // within the fuzzer's memory limit
  o.chunk_bytes = 4096;
  server srv(o);
  const std::string secret(transport::identity_size, 's');
  srv.use_job_secret(secret);

  fuzz::asio::io_context io;
  fuzz::socket_pair sp;
  wire::limits lim;
  lim.max_payload = o.max_frame_bytes;
  auto c = std::make_shared<transport::tcp_connection>(sp.take_socket(io), srv, lim,
                                                       o.security(true), o.chunk_bytes);
  c->start();
  const std::string nonce = fuzz::read_challenge(io, sp);
  const std::string a = fuzz::auth_frame(nonce);
  sp.write(a.data(), a.size());
  if (mode & 4) {
    // The proof names the connection's binding: wait for the handshake to fix it.
    for (int i = 0; i < 5000 && !c->authenticated() && !c->is_closed(); ++i)
      io.run_for(std::chrono::milliseconds(1));
    if (!c->authenticated()) std::abort();  // the harness's own proof must pass
    wire::header h;
    h.command = wire::cmd::hello;
    h.aux = 0;
    const std::string proof = transport::hello_proof(
        transport::node_credential(secret, detail::worker_id(0)), c->binding(), srv.id(), 0);
    h.meta_len = static_cast<std::uint32_t>(proof.size());
    auto b = wire::encode(h);
    std::string hello(reinterpret_cast<const char*>(b.data()), b.size());
    hello += proof;
    sp.write(hello.data(), hello.size());
  }
  sp.write(data, size);
  sp.close_writing();
  // Drain what the server answers so its writes never stall on a full socket.
  std::thread drain([fd = sp.peer] {
    char buf[65536];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
  });
  fuzz::run_until_closed(io, *c);
  ::shutdown(sp.peer, SHUT_RD);
  drain.join();
  return 0;
}
