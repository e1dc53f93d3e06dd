// The raw Asio TCP baseline's server session, server process and client (raw_baseline.hpp):
// the only kv_bench file that compiles Asio's bodies.
#include "raw_baseline.hpp"

#include "harness.hpp"

#include <kvstore/client/partition.hpp>
#include <kvstore/options.hpp>
#include <kvstore/transport/tcp_congestion.hpp>

#include <boost/asio.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>

namespace kv_bench {

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// 24-byte header: op (u32: raw_op), pad (u32), len (u64), off (u64). Push: len payload bytes
// follow, stored at off in the server's store, answered by a header-only ack. Pull: answered by a
// header and the len bytes at off. Ping: len bytes follow and come back. Pull by keys: len bytes
// (8-byte keys) follow, answered by a header and len / 2 bytes (a float per key). Each key has its
// own off, as each kvstore key has its own memory on both sides: a baseline that moved every key
// through one cache-hot buffer would do less work.
struct bhdr {
  std::uint32_t op = 0, pad = 0;
  std::uint64_t len = 0, off = 0;
};
static_assert(sizeof(bhdr) == 24);

class base_session : public std::enable_shared_from_this<base_session> {
 public:
  base_session(tcp::socket s, std::vector<char>& store, std::size_t& open)
      : sock_(std::move(s)), store_(store), open_(open) {
    sock_.set_option(tcp::no_delay(true));
    kvstore::transport::apply_congestion(sock_, congestion_option());
    rbuf_.resize(256 << 10);
  }
  void start() { read_more(); }

 private:
  void read_more() {
    if (rbeg_ == rend_) rbeg_ = rend_ = 0;
    if (rend_ == rbuf_.size()) {
      std::memmove(rbuf_.data(), rbuf_.data() + rbeg_, rend_ - rbeg_);
      rend_ -= rbeg_;
      rbeg_ = 0;
    }
    sock_.async_read_some(asio::buffer(rbuf_.data() + rend_, rbuf_.size() - rend_),
                          [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                            if (ec) return self->closed();
                            self->rend_ += n;
                            self->parse();
                          });
  }
  void closed() {
    if (closed_) return;
    closed_ = true;
    if (--open_ == 0) static_cast<asio::io_context&>(sock_.get_executor().context()).stop();
  }
  void parse() {
    for (;;) {
      const std::size_t avail = rend_ - rbeg_;
      if (!in_payload_) {
        if (avail < sizeof(bhdr)) return read_more();
        std::memcpy(&cur_, rbuf_.data() + rbeg_, sizeof cur_);
        rbeg_ += sizeof cur_;
        if (cur_.len > store_.size() || cur_.off > store_.size() - cur_.len) return closed();
        if (cur_.op == raw_pull) {  // answer from the store
          queue(cur_, store_.data() + cur_.off, cur_.len);
          continue;
        }
        in_payload_ = true;
        got_ = 0;
        continue;
      }
      const std::size_t take = std::min<std::size_t>(cur_.len - got_, avail);
      std::memcpy(store_.data() + cur_.off + got_, rbuf_.data() + rbeg_, take);
      rbeg_ += take;
      got_ += take;
      if (got_ < cur_.len) {
        // The rest straight into its destination.
        rbeg_ = rend_ = 0;
        asio::async_read(sock_, asio::buffer(store_.data() + cur_.off + got_, cur_.len - got_),
                         [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                           if (ec) return self->closed();
                           self->got_ += n;
                           self->payload_done();
                           self->parse();
                         });
        return;
      }
      payload_done();
    }
  }
  void payload_done() {
    in_payload_ = false;
    if (cur_.op == raw_ping)
      queue(cur_, store_.data() + cur_.off, cur_.len);  // echo
    else if (cur_.op == raw_pull_keys)
      queue(bhdr{raw_pull_keys, 0, cur_.len / 2, cur_.off}, store_.data() + cur_.off,
            cur_.len / 2);  // a float per key asked
    else
      queue(bhdr{raw_push, 0, 0, 0}, nullptr, 0);  // push: ack
  }
  void queue(bhdr h, const char* p, std::size_t n) {
    out_.push_back({h, p, n});
    if (!writing_) write_more();
  }
  void write_more() {
    if (out_.empty()) {
      writing_ = false;
      return;
    }
    writing_ = true;
    sending_.swap(out_);
    out_.clear();
    bufs_.clear();
    for (auto& o : sending_) {
      bufs_.emplace_back(&o.h, sizeof o.h);
      if (o.n) bufs_.emplace_back(o.p, o.n);
    }
    asio::async_write(sock_, bufs_,
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (ec) return self->closed();
                        self->sending_.clear();
                        self->write_more();
                      });
  }

  struct outgoing {
    bhdr h;
    const char* p;
    std::size_t n;
  };
  tcp::socket sock_;
  std::vector<char>& store_;
  std::size_t& open_;
  std::vector<char> rbuf_;
  std::size_t rbeg_ = 0, rend_ = 0;
  bool in_payload_ = false;
  bhdr cur_;
  std::size_t got_ = 0;
  std::vector<outgoing> out_, sending_;
  std::vector<asio::const_buffer> bufs_;
  bool writing_ = false;
  bool closed_ = false;
};

}  // namespace

int raw_server(int fd, int clients, std::size_t max_bytes) {
  asio::io_context io;
  tcp::acceptor acc(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  std::vector<char> store(max_bytes, 1);  // touched: no page faults in the timed part
  std::size_t open = static_cast<std::size_t>(clients);
  write_all(fd, "P " + std::to_string(acc.local_endpoint().port()) + "\n");
  int accepted = 0;
  std::function<void()> accept = [&] {
    acc.async_accept([&](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;
      std::make_shared<base_session>(std::move(s), store, open)->start();
      if (++accepted < clients) accept();
    });
  };
  accept();
  // Bounded: a client that never comes or never leaves ends this after the limit.
  asio::steady_timer limit(io, std::chrono::minutes(5));
  limit.async_wait([&](boost::system::error_code ec) {
    if (!ec) io.stop();
  });
  io.run();
  return 0;
}

struct raw_client::impl {
  asio::io_context io_;
  std::vector<tcp::socket> socks_;
  std::vector<char> send_;
  std::vector<std::vector<char>> recv_;  // per server
};

raw_client::raw_client(const std::vector<std::uint16_t>& ports, std::size_t max_bytes)
    : impl_(std::make_unique<impl>()) {
  auto& m = *impl_;
  m.recv_.assign(ports.size(), std::vector<char>(max_bytes + 64));
  for (auto p : ports) {
    m.socks_.emplace_back(m.io_);
    m.socks_.back().connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), p));
    m.socks_.back().set_option(tcp::no_delay(true));
    kvstore::transport::apply_congestion(m.socks_.back(), congestion_option());
  }
  m.send_.assign(max_bytes, 2);
}

raw_client::~raw_client() = default;

void raw_client::batch(raw_op op, const std::vector<raw_part>& parts, std::size_t count) {
  auto& m = *impl_;
  const std::size_t S = m.socks_.size();
  std::vector<std::vector<bhdr>> hdrs(S);
  std::vector<std::vector<asio::const_buffer>> wbufs(S);
  std::vector<std::size_t> expect(S, 0);
  for (auto& p : parts) hdrs[static_cast<std::size_t>(p.server)].reserve(count * parts.size());
  for (std::size_t c = 0; c < count; ++c)
    for (auto& p : parts) {
      auto& h = hdrs[static_cast<std::size_t>(p.server)];
      if (p.offset + p.bytes > m.send_.size())
        throw std::runtime_error("baseline part outside the send buffer");
      h.push_back(bhdr{op, 0, p.bytes, p.offset});
      wbufs[static_cast<std::size_t>(p.server)].emplace_back(&h.back(), sizeof(bhdr));
      if (op != raw_pull && p.bytes)
        wbufs[static_cast<std::size_t>(p.server)].emplace_back(m.send_.data() + p.offset, p.bytes);
      expect[static_cast<std::size_t>(p.server)] +=
          sizeof(bhdr) + (op == raw_push        ? 0
                          : op == raw_pull_keys ? p.bytes / 2
                                                : p.bytes);
    }
  // The answers of one server land one after another in its recv_, each key's in its own
  // place as in a worker's outputs; the next batch reuses them, as a worker pulling the same
  // keys again does (past the buffer's end they wrap: a sink).
  std::size_t pending = 0;
  std::vector<std::size_t> got(S, 0);
  std::function<void(std::size_t)> read_some = [&](std::size_t s) {
    auto& r = m.recv_[s];
    const std::size_t at = got[s] % r.size(), n = std::min(expect[s] - got[s], r.size() - at);
    asio::async_read(m.socks_[s], asio::buffer(r.data() + at, n),
                     [&, s](boost::system::error_code ec, std::size_t k) {
                       if (ec) throw std::runtime_error("baseline read: " + ec.message());
                       got[s] += k;
                       if (got[s] < expect[s]) return read_some(s);
                       --pending;
                     });
  };
  for (std::size_t s = 0; s < S; ++s) {
    if (!expect[s]) continue;
    pending += 2;
    asio::async_write(m.socks_[s], wbufs[s], [&](boost::system::error_code ec, std::size_t) {
      if (ec) throw std::runtime_error("baseline write: " + ec.message());
      --pending;
    });
    read_some(s);
  }
  m.io_.restart();
  m.io_.run();
  if (pending) throw std::runtime_error("baseline batch did not complete");
}

std::vector<raw_part> parts_of(std::uint64_t id, std::size_t bytes, int S, std::size_t offset) {
  const kvstore::dist_options o;
  std::vector<raw_part> p;
  for (auto& s :
       kvstore::detail::partition(id, bytes / sizeof(float), 0, sizeof(float), S, o.slice_bytes))
    p.push_back({s.server, (s.hi - s.lo) * sizeof(float), offset + s.lo * sizeof(float)});
  return p;
}

std::string congestion_used() {
  return kvstore::transport::congestion_choice(congestion_option(),
                                               asio::ip::make_address("127.0.0.1"));
}

}  // namespace kv_bench
