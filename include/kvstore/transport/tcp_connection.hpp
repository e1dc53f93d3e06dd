// One framed TCP connection over Boost.Asio: a buffered frame reader that hands payloads to a
// sink chosen by the owner (so a pull's answer lands straight in the caller's buffer), and the
// writes of its send side (transport/frame_writer.hpp: the queue, direct writes, gathered
// writes straight from the caller's buffers), driven here. All socket work happens on the
// connection's executor (one io thread per process); send() may be called from any thread.
// Before any of that, TLS (when on), the token handshake and the deadlines: the steps of
// transport/tcp_handshake.hpp, its base. What a connection holds and its steps that wait on
// nothing are transport/connection_state.hpp's.
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/transport/connection_state.hpp>
#include <kvstore/transport/endpoint.hpp>
#include <kvstore/transport/frame_handler.hpp>
#include <kvstore/transport/frame_writer.hpp>
#include <kvstore/transport/out_frame.hpp>
#include <kvstore/transport/socket_io.hpp>
#include <kvstore/transport/tcp_handshake.hpp>
#include <kvstore/wire/frame.hpp>

#include <boost/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kvstore::transport {

class tcp_connection final : public tcp_handshake<tcp_connection> {
 public:
  tcp_connection(tcp::socket sock, frame_handler& handler, wire::limits lim, security sec,
                 std::size_t gather_bytes = std::size_t{1} << 20)
      : tcp_handshake(std::move(sock), handler, lim, std::move(sec), gather_bytes) {}

  /// Starts the handshake and reading. Call once, after the owner has stored the shared_ptr.
  /// Frames sent before the handshake is done wait for it.
  void start() override {
    asio::dispatch(sock_.get_executor(), [self = self_as<tcp_connection>()] { self->begin(); });
  }

  /// Queues a frame; thread-safe. Frames of equal priority go out in the order queued.
  /// With `may_write_now`, a frame sent while nothing else is queued or being written goes to
  /// the socket at once from the calling thread (one non-blocking sendmsg, no hand-off to the io
  /// thread); what the socket does not take at once is finished by the io thread. Callers pass
  /// it for latency-bound sends (nothing else in flight), not for bursts, which the io thread
  /// gathers into fewer, larger writes. A frame in pieces (out_frame::pieces) always goes
  /// through the io thread.
  void send(out_frame&& f, bool may_write_now = false) override {
    // authed_ is stored after tls_ is set, so tls_ is safe to read once authed_ is seen true.
    const bool open = authed_.load();
    const int direct_fd = may_write_now && open && !tls_ ? sock_.native_handle() : -1;
    // On the connection's own io thread (a server answering inside its frame handler) the write
    // starts at once; from any other thread it is posted there.
    if (writer_.queue(std::move(f), direct_fd, open) == frame_writer::queued::start)
      asio::dispatch(sock_.get_executor(),
                     [self = self_as<tcp_connection>()] { self->write_more(); });
  }

  /// Queues `h`, an ok answer to pushes (wire::acks_header, sender set); thread-safe. When it
  /// continues the acks queued last it extends them in place, with no frame built or moved.
  void send_acks(const wire::header& h) override {
    if (writer_.extend_acks(h)) return;
    out_frame f;
    f.h = h;
    send(std::move(f));
  }

  /// Closes the connection (from any thread); the handler's on_close runs once with `reason`.
  void close(std::string reason) override {
    asio::post(sock_.get_executor(), [self = self_as<tcp_connection>(),
                                      reason = std::move(reason)] { self->fail(reason); });
  }

  /// Goes on reading where pause_reading() stopped; from any thread.
  void resume_reading() override {
    asio::post(sock_.get_executor(), [self = self_as<tcp_connection>()] {
      self->paused_by_owner_ = false;
      self->maybe_resume();
    });
  }

 private:
  friend class tcp_handshake<tcp_connection>;  // its steps read, write and fail through these

  void start_writing() {
    if (writer_.begin_writing()) write_more();
  }

  // ---- reading ------------------------------------------------------------------------------
  void read_more() {
    if (closed_flag_ || closing_) return;
    if (rend_ == rbuf_.size()) restart_buffer();  // so the next header fits
    io([&](auto& st) {
      st.async_read_some(
          asio::buffer(rbuf_.data() + rend_, rbuf_.size() - rend_),
          [self = self_as<tcp_connection>()](boost::system::error_code ec, std::size_t n) {
            if (ec)
              return self->lose_link(ec == asio::error::eof ? "closed by peer"
                                                            : "read: " + ec.message());
            self->rend_ += n;
            self->sink_reads_in_row_ = 0;
            self->last_rx_ = std::chrono::steady_clock::now();
            self->parse();
          });
    });
  }

  // Parses as many whole frames as the buffer holds; reads big payloads straight to their sink.
  void parse() {
    for (;;) {
      if (closed_flag_ || closing_) return;
      std::size_t avail = rend_ - rbeg_;
      if (stage_ == stage::header) {
        if (must_stall()) {
          stalled_ = true;  // maybe_resume() goes on from here
          return;
        }
        if (avail < wire::header_size) {
          // The few bytes left move to the front, so the next read has the whole buffer: read
          // into what was left of it, a busy link took two or three reads per 64 KiB.
          restart_buffer();
          return read_more();
        }
        std::string why;
        if (!wire::decode(rbuf_.data() + rbeg_, cur_, limits_, why))
          return fail("bad frame from " + remote_ + ": " + why);
        rbeg_ += wire::header_size;
        meta_.clear();
        stage_ = stage::meta;
        continue;
      }
      if (stage_ == stage::meta) {
        std::size_t want = cur_.meta_len - meta_.size();
        std::size_t take = std::min(want, avail);
        if (take) meta_.append(reinterpret_cast<const char*>(rbuf_.data() + rbeg_), take);
        rbeg_ += take;
        if (meta_.size() < cur_.meta_len) {
          restart_buffer();  // all of it was taken into meta_
          return read_more();
        }
        // Meta complete: choose the payload's destination.
        sink_ = {};
        if (proven_) {
          try {
            sink_ = handler_->payload_sink(*this, cur_);
          } catch (const std::exception& e) {
            return fail(std::string("refused frame: ") + e.what());
          }
        }
        // Without a sink of the owner's, the connection's own buffer grows as the bytes arrive:
        // a header's word alone allocates nothing.
        own_sink_ = sink_.size() != cur_.payload_len;
        if (own_sink_) sink_ = {};
        got_ = 0;
        stage_ = stage::payload;
        continue;
      }
      // stage::payload
      std::size_t want = cur_.payload_len - got_;
      std::size_t take = std::min(want, avail);
      if (own_sink_) grow_own(got_ + take);
      if (take) std::memcpy(sink_.data() + got_, rbuf_.data() + rbeg_, take);
      rbeg_ += take;
      got_ += take;
      if (got_ < cur_.payload_len) {
        restart_buffer();  // all of it was taken into the sink
        // A small rest comes through the buffer, with the frames behind it: read alone, it cost
        // a read per frame where one read takes several (a copy of a few KiB costs less).
        if (cur_.payload_len - got_ <= small_rest_bytes) return read_more();
        // The rest goes straight into the sink, no staging copy; the own buffer at most doubles
        // per read, so it never holds much more than what arrived.
        std::size_t chunk = cur_.payload_len - got_;
        if (own_sink_) {
          grow_own(
              std::min<std::uint64_t>(cur_.payload_len, got_ + std::max(got_, read_buffer_size)));
          chunk = sink_.size() - got_;
        }
        // Plain TCP reads here, a few payloads in a row at most (then through asio, whose
        // posted completion lets the io thread write what it queued).
        if (!tls_ && sink_reads_in_row_ < max_sink_reads_in_row) {
          ++sink_reads_in_row_;
          if (!read_into_sink(chunk)) return;  // waiting for bytes (or the link is lost)
          if (got_ == cur_.payload_len) deliver();
          continue;
        }
        io([&](auto& st) {
          asio::async_read(
              st, asio::buffer(sink_.data() + got_, chunk),
              [self = self_as<tcp_connection>()](boost::system::error_code ec, std::size_t n) {
                if (ec) return self->lose_link("read: " + ec.message());
                self->sink_reads_in_row_ = 0;
                self->got_ += n;
                if (self->got_ == self->cur_.payload_len) self->deliver();
                self->parse();
              });
        });
        return;
      }
      deliver();
    }
  }

  // Plain TCP: `chunk` more bytes of the payload straight into its sink and, in the same
  // recvmsg, what follows them into the read buffer, which parse() left empty: read alone, a
  // big payload's rest cost a second read for the frames behind it. True once the chunk is in;
  // false when the socket has no bytes now (a wait for them goes on, and parsing after it) or
  // the link is lost.
  bool read_into_sink(std::size_t chunk) {
    for (;;) {
      iovec iov[2] = {{sink_.data() + got_, chunk}, {rbuf_.data() + rend_, rbuf_.size() - rend_}};
      const socket_io_result r = receive_some(sock_.native_handle(), iov);
      if (r.would_block) {
        sock_.async_wait(tcp::socket::wait_read,
                         [self = self_as<tcp_connection>(), chunk](boost::system::error_code ec) {
                           if (self->closed_flag_) return;
                           if (ec) return self->lose_link("read: " + ec.message());
                           self->sink_reads_in_row_ = 0;
                           if (!self->read_into_sink(chunk)) return;
                           if (self->got_ == self->cur_.payload_len) self->deliver();
                           self->parse();
                         });
        return false;
      }
      if (r.eof || r.error) {
        lose_link(r.eof ? "closed by peer" : "read: " + errno_message(r.error));
        return false;
      }
      last_rx_ = std::chrono::steady_clock::now();
      const std::size_t to_sink = std::min(r.bytes, chunk);
      got_ += to_sink;
      chunk -= to_sink;
      rend_ += r.bytes - to_sink;
      if (!chunk) return true;
    }
  }

  void deliver() {
    stage_ = stage::header;
    auto payload = std::span<const std::byte>(sink_.data(), cur_.payload_len);
    if (!proven_ || closing_) {
      if (!closing_) handshake(cur_, meta_);
      meta_.clear();
      return;
    }
    if (!sec_.acceptor && cur_.command == wire::cmd::response && cur_.req_id == 0 &&
        cur_.status == static_cast<std::uint32_t>(errc::auth_failed))
      return fail("the peer refused this node's token (KVSTORE_TOKEN differs)");
    try {
      handler_->on_frame(*this, cur_, std::move(meta_), payload);
    } catch (const std::exception& e) {
      fail(std::string("refused frame: ") + e.what());
    }
    meta_.clear();
    if (own_.capacity() > (std::size_t{4} << 20)) std::vector<std::byte>().swap(own_);
  }

  // ---- pausing ------------------------------------------------------------------------------
  void maybe_resume() {
    if (!stalled_ || closed_flag_ || closing_ || must_stall()) return;
    stalled_ = false;
    parse();
  }

  // ---- writing ------------------------------------------------------------------------------
  // Writes the queued frames: gathered (frame_writer::gather), then sent; plain TCP with the
  // writer's own sendmsg calls (send_gathered), TLS through its stream's async_write. The next
  // gather runs from a posted handler, as asio's completion would: the frames the io thread
  // queues meanwhile (answers to the frames it is parsing) go out together, and acks merge, not
  // a sendmsg each.
  void write_more() {
    if (!writer_.gather(tls_ != nullptr)) return;
    if (tls_) {
      // The writer's buffers stay untouched until this write completes.
      asio::async_write(
          *tls_, writer_.tls_buffers(),
          [self = self_as<tcp_connection>()](boost::system::error_code ec, std::size_t) {
            if (ec) return self->lose_link("write: " + ec.message());
            self->frames_written();
            self->write_more();
          });
      return;
    }
    if (send_gathered()) written_then_more();  // else the socket is full: its wait goes on
  }
  void written_then_more() {
    frames_written();
    asio::post(sock_.get_executor(), [self = self_as<tcp_connection>()] { self->write_more(); });
  }

  // Sends the gathered write: true once all of it went. When the socket takes no more, false,
  // and a wait for room goes on with the rest (or the link is lost). asio::async_write hands
  // each sendmsg at most 16 buffers and 64 KiB (its consuming_buffers and transfer_all): small
  // frames, two or three buffers each, went five or six to a syscall, and the peer woke for
  // each.
  bool send_gathered() {
    const frame_writer::send_result r = writer_.send(sock_.native_handle());
    if (r.done) return true;
    if (r.error) {
      lose_link("write: " + errno_message(r.error));
      return false;
    }
    sock_.async_wait(tcp::socket::wait_write,
                     [self = self_as<tcp_connection>()](boost::system::error_code ec) {
                       if (self->closed_flag_) return;
                       if (ec) return self->lose_link("write: " + ec.message());
                       if (self->send_gathered()) self->written_then_more();
                     });
    return false;
  }

  // The gathered frames are on the wire: their bytes leave the queued count, reading may resume.
  void frames_written() {
    writer_.written();
    maybe_resume();
  }

  void lose_link(const std::string& reason) {
    if (!closed_flag_) link_lost_ = true;
    fail(reason);
  }
  void fail(const std::string& reason) {
    if (closed_flag_.exchange(true)) return;
    writer_.close();
    boost::system::error_code ec;
    timer_.cancel();
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    handler_->on_close(*this, reason);
  }
};

}  // namespace kvstore::transport
