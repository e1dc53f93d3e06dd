// In-process links: a worker, servers and a scheduler in one process, talking through the same
// connection interface as over TCP, without sockets. A node whose host is "inproc" listens on a
// port of this process's table (inproc_network), and a peer that dials "inproc" and that port
// gets one end of a pair; each end hands the other's frames to its owner on its own executor, as
// a TCP connection does. Both ends come from one program's options: the token must match and
// the dialed role must be the listener's, but no TLS and no challenge run (nothing leaves the
// process). Frame limits and back-pressure (max_queued_bytes) hold as over TCP.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/transport/auth.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/security.hpp>
#include <kvstore/wire/frame.hpp>

#include <boost/asio.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace kvstore::transport {

/// The host that names this process's in-process network ("inproc", in bind_host,
/// scheduler_host or an address book).
inline constexpr std::string_view inproc_host = "inproc";
inline bool is_inproc(std::string_view host) noexcept { return host == inproc_host; }

/// One end of an in-process link.
class inproc_connection final : public connection {
 public:
  using executor = boost::asio::any_io_executor;
  using ptr = std::shared_ptr<inproc_connection>;

  /// What one end is: where its owner runs, who its owner is, what it accepts.
  struct end {
    executor ex;
    frame_handler* handler;
    transport_security sec;
    wire::limits limits;
  };

  /// A linked pair: first the dialer's end, then the listener's. Neither is started.
  static std::pair<ptr, ptr> linked_pair(end dialer, end listener, std::uint16_t port,
                                         std::uint64_t dial_no) {
    auto a =
        std::make_shared<inproc_connection>(std::move(dialer), "inproc:" + std::to_string(port));
    auto b = std::make_shared<inproc_connection>(std::move(listener),
                                                 "inproc:dialer-" + std::to_string(dial_no));
    a->peer_ = b;
    b->peer_ = a;
    a->proven_role_ = b->end_.sec.self;
    b->proven_role_ = a->end_.sec.self;
    a->binding_ = b->binding_ = make_nonce() + make_nonce();  // as TCP's: both nonces
    return {a, b};
  }

  inproc_connection(end e, std::string remote) : end_(std::move(e)), remote_(std::move(remote)) {}

  void start() override {
    boost::asio::dispatch(end_.ex, [self = self_as<inproc_connection>()] {
      {
        std::lock_guard lk(self->m_);
        if (self->closed_) return;
        self->started_ = true;
      }
      self->end_.handler->on_authenticated(*self);
      self->schedule();
    });
  }

  void send(out_frame&& f, bool = false) override {
    auto p = peer_.lock();
    if (closed_ || !p) return;
    frame fr;
    fr.h = f.h;
    fr.h.meta_len = static_cast<std::uint32_t>(f.meta.size());
    fr.h.payload_len = f.payload_len;
    fr.meta = std::move(f.meta);
    fr.payload.resize(f.payload_len);
    std::size_t at = 0;
    if (!f.pieces.empty()) {
      for (auto piece : f.pieces) {
        std::memcpy(fr.payload.data() + at, piece.data(), piece.size());
        at += piece.size();
      }
    } else if (f.payload_len) {
      std::memcpy(fr.payload.data(), f.payload, f.payload_len);
    }
    fr.bytes = wire::header_size + fr.meta.size() + fr.payload.size();
    queued_ += fr.bytes;
    p->arrive(std::move(fr));
  }

  void close(std::string reason) override {
    boost::asio::post(end_.ex, [self = self_as<inproc_connection>(), reason = std::move(reason)] {
      self->fail(reason, false);
    });
  }

  void pause_reading() override {
    std::lock_guard lk(m_);
    paused_ = true;
  }
  void resume_reading() override {
    {
      std::lock_guard lk(m_);
      paused_ = false;
    }
    boost::asio::post(end_.ex, [self = self_as<inproc_connection>()] { self->schedule(); });
  }

  bool authenticated() const noexcept override { return started_.load(); }
  kvstore::role peer_proven_role() const noexcept override { return proven_role_; }
  const std::string& binding() const noexcept override { return binding_; }
  std::size_t queued_bytes() const noexcept override { return queued_.load(); }
  bool is_closed() const noexcept override { return closed_.load(); }
  bool link_lost() const noexcept override { return link_lost_.load(); }
  const std::string& remote() const noexcept override { return remote_; }

 private:
  struct frame {
    wire::header h;
    std::string meta;
    std::vector<std::byte> payload;
    std::size_t bytes = 0;
  };
  // Frames delivered in a row before the executor runs other work (the peer's writes, timers).
  static constexpr int frames_per_turn = 64;

  // A frame of the peer's, from the peer's sending thread.
  void arrive(frame&& fr) {
    bool kick = false;
    {
      std::lock_guard lk(m_);
      if (closed_) return;
      const auto prio = fr.h.priority;
      inbox_[prio].push_back(std::move(fr));
      kick = started_ && !scheduled_ && !paused_ && !stalled_;
      if (kick) scheduled_ = true;
    }
    if (kick) boost::asio::post(end_.ex, [self = self_as<inproc_connection>()] { self->drain(); });
  }

  // Posts a drain unless one is on the way or nothing can be delivered.
  void schedule() {
    {
      std::lock_guard lk(m_);
      if (closed_ || !started_ || scheduled_ || paused_ || inbox_.empty()) return;
      stalled_ = must_stall();
      if (stalled_) return;
      scheduled_ = true;
    }
    boost::asio::post(end_.ex, [self = self_as<inproc_connection>()] { self->drain(); });
  }

  // Reading waits while the peer leaves more than max_queued_bytes of this end's frames
  // undelivered (it goes on below half of that), as a TCP acceptor's does.
  bool must_stall() const {
    const std::size_t cap = end_.sec.max_queued_bytes;
    return cap && queued_.load() > (stalled_ ? cap / 2 : cap);
  }

  // On the executor: delivers up to frames_per_turn frames, then yields to other work.
  void drain() {
    for (int i = 0; i < frames_per_turn; ++i) {
      frame fr;
      {
        std::lock_guard lk(m_);
        if (closed_ || paused_ || inbox_.empty() || must_stall()) {
          stalled_ = !closed_ && !paused_ && !inbox_.empty();
          scheduled_ = false;
          return;
        }
        auto first = inbox_.begin();
        fr = std::move(first->second.front());
        first->second.pop_front();
        if (first->second.empty()) inbox_.erase(first);
      }
      deliver(fr);
      if (auto p = peer_.lock()) p->delivered(fr.bytes);
    }
    boost::asio::post(end_.ex, [self = self_as<inproc_connection>()] { self->drain(); });
  }

  // The peer delivered `n` bytes of this end's frames: a stalled reader may go on.
  void delivered(std::size_t n) {
    queued_ -= n;
    bool resume = false;
    {
      std::lock_guard lk(m_);
      resume = stalled_ && !must_stall();
    }
    if (resume)
      boost::asio::post(end_.ex, [self = self_as<inproc_connection>()] {
        {
          std::lock_guard lk(self->m_);
          self->stalled_ = false;
        }
        self->schedule();
      });
  }

  void deliver(frame& fr) {
    // The limits a TCP reader checks on the header's bytes, on the same bytes.
    const auto bytes = wire::encode(fr.h);
    wire::header h;
    std::string why;
    if (!wire::decode(bytes.data(), h, end_.limits, why))
      return fail("bad frame from " + remote_ + ": " + why, false);
    std::span<const std::byte> payload(fr.payload);
    try {
      const auto sink = end_.handler->payload_sink(*this, h);
      if (!fr.payload.empty() && sink.size() == fr.payload.size()) {
        std::memcpy(sink.data(), fr.payload.data(), fr.payload.size());
        payload = sink;
      }
      end_.handler->on_frame(*this, h, std::move(fr.meta), payload);
    } catch (const std::exception& e) {
      fail(std::string("refused frame: ") + e.what(), false);
    }
  }

  // On the executor: closes this end once (its owner's on_close runs), then the peer's.
  void fail(const std::string& reason, bool lost) {
    {
      std::lock_guard lk(m_);
      if (closed_) return;
      if (lost) link_lost_ = true;
      closed_ = true;
      inbox_.clear();
    }
    end_.handler->on_close(*this, reason);
    if (auto p = peer_.lock())
      boost::asio::post(p->end_.ex, [p] { p->fail("closed by peer", true); });
  }

  end end_;
  std::string remote_;
  std::weak_ptr<inproc_connection> peer_;
  kvstore::role proven_role_ = kvstore::role::worker;
  std::string binding_;

  std::mutex m_;
  // Undelivered frames, highest priority first, in arrival order within one (as TCP's send
  // queue orders them).
  std::map<std::int32_t, std::deque<frame>, std::greater<>> inbox_;
  bool scheduled_ = false;  // a drain is posted or running
  bool paused_ = false;     // pause_reading()
  bool stalled_ = false;    // must_stall() stopped the drain; delivered() resumes it
  std::atomic<bool> started_{false};
  std::atomic<bool> closed_{false};
  std::atomic<bool> link_lost_{false};
  std::atomic<std::size_t> queued_{0};  // bytes of this end's frames the peer has not delivered
};

/// This process's in-process ports: a node listens on one, a peer dials it.
class inproc_network {
 public:
  /// What a listening node gives: its end's parts, and what it does with a new end (from the
  /// dialer's thread: it posts to its own executor).
  struct listener {
    inproc_connection::end end;
    std::function<void(std::shared_ptr<connection>)> accept;
    const void* owner = nullptr;  // who may unlisten
  };

  static inproc_network& get() {
    static inproc_network net;
    return net;
  }

  /// Listens on `port` (0: the lowest free one). Throws kvstore::error(unreachable) when taken.
  std::uint16_t listen(std::uint16_t port, listener l) {
    std::lock_guard lk(m_);
    if (port == 0) {
      for (port = 1; port != 0 && ports_.count(port); ++port) {
      }
      if (port == 0) throw error(errc::unreachable, "inproc: every port is taken");
    } else if (ports_.count(port)) {
      throw error(errc::unreachable, "inproc port " + std::to_string(port) + " is taken");
    }
    ports_.emplace(port, std::move(l));
    return port;
  }

  /// Stops `owner` listening on `port` (a port it gave up and another took is left alone);
  /// once it returns, no new end reaches it.
  void unlisten(std::uint16_t port, const void* owner) {
    std::lock_guard lk(m_);
    if (auto it = ports_.find(port); it != ports_.end() && it->second.owner == owner)
      ports_.erase(it);
  }

  /// Dials `port` as `dialer`, waiting up to `timeout` for a listener (as a TCP connect retries
  /// a refused port); `what` names the peer in the error. The returned end is not started.
  std::shared_ptr<connection> dial(std::uint16_t port, inproc_connection::end dialer,
                                   std::chrono::milliseconds timeout, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      {
        std::lock_guard lk(m_);
        if (auto it = ports_.find(port); it != ports_.end())
          return pair_with(it->second, dialer, port);
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw error(errc::unreachable, "cannot connect to " + what + " at inproc:" +
                                           std::to_string(port) + ": nothing listens there");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }

 private:
  // Under m_: the pair, the listener's end handed to it. What a TCP handshake would refuse is
  // refused here, to the dialer.
  std::shared_ptr<connection> pair_with(listener& l, inproc_connection::end& dialer,
                                        std::uint16_t port) {
    if (dialer.sec.token != l.end.sec.token)
      throw error(errc::auth_failed, "the peer refused this node's token (KVSTORE_TOKEN differs)");
    if (dialer.sec.expect_peer && *dialer.sec.expect_peer != l.end.sec.self)
      throw error(errc::auth_failed, std::string("inproc peer is a ") +
                                         kvstore::detail::role_name(l.end.sec.self) + ", not a " +
                                         kvstore::detail::role_name(*dialer.sec.expect_peer));
    if (l.end.sec.expect_peer && *l.end.sec.expect_peer != dialer.sec.self)
      throw error(errc::auth_failed, std::string("inproc: a ") +
                                         kvstore::detail::role_name(dialer.sec.self) +
                                         " cannot connect to a node that takes only a " +
                                         kvstore::detail::role_name(*l.end.sec.expect_peer));
    auto [a, b] = inproc_connection::linked_pair(dialer, l.end, port, ++dials_);
    l.accept(std::move(b));
    return a;
  }
  std::mutex m_;
  std::map<std::uint16_t, listener> ports_;
  std::uint64_t dials_ = 0;
};

}  // namespace kvstore::transport
