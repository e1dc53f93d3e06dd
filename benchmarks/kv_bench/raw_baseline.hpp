// The raw Asio TCP baseline: a server process's loop and a client that sends batches of framed
// messages, moving the same bytes to the same servers as kvstore. Asio stays in raw_baseline.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kv_bench {

// The baseline's message kinds (a 24-byte header's op).
enum raw_op : std::uint32_t { raw_push = 1, raw_pull = 2, raw_ping = 3, raw_pull_keys = 4 };

// `bytes` of a key to or from `server`, read from the client's send buffer and stored on the
// server at `offset`.
struct raw_part {
  int server;
  std::size_t bytes;
  std::size_t offset = 0;
};

// The client side: per server, one async write of a batch of messages and one async read of
// the exactly known answer, all on one io_context (as a kvstore worker's single io thread).
class raw_client {
 public:
  raw_client(const std::vector<std::uint16_t>& ports, std::size_t max_bytes);
  ~raw_client();
  // Sends `count` messages of kind op for each of `parts` (one op = all parts) and waits for all
  // answers.
  void batch(raw_op op, const std::vector<raw_part>& parts, std::size_t count);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// A baseline server process: writes "P <port>\n" to fd, accepts `clients` connections and
// serves them from a store of max_bytes until all have closed (at most 5 minutes).
int raw_server(int fd, int clients, std::size_t max_bytes);

// How kvstore places key `id` of `bytes` on S servers, as baseline parts.
// `offset`: where the key's bytes start, on both sides.
std::vector<raw_part> parts_of(std::uint64_t id, std::size_t bytes, int S, std::size_t offset = 0);

// The congestion control both sides' sockets run for congestion_option() on 127.0.0.1; empty
// when they keep the host's default.
std::string congestion_used();

}  // namespace kv_bench
