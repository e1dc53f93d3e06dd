// A worker's network side: joins the job through the scheduler, connects to every server, sends
// requests (one or more frames sharing a request id) and completes them when their answers come
// back, within a deadline. Pull answers are read straight into the caller's buffer. A lost server
// or scheduler fails that peer's requests at once with an error naming it; a silent one fails
// them at their deadline. In layers: client/worker_links.hpp (the state, sending, deadlines),
// client/join.hpp (joining), and here the answers, the address book, lost and restarted servers.
#pragma once

#include <kvstore/client/call.hpp>
#include <kvstore/client/colocated_roles.hpp>  // own_server
#include <kvstore/client/join.hpp>
#include <kvstore/client/pending.hpp>
#include <kvstore/client/worker_links.hpp>
#include <kvstore/detail/log.hpp>
#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/op.hpp>
#include <kvstore/options.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/dial.hpp>
#include <kvstore/wire/commands.hpp>
#include <kvstore/wire/messages.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvstore::detail {

class worker_client final : public worker_join {
 public:
  /// Joins the job: registers with the scheduler, waits for the address book, connects to every
  /// server. Throws kvstore::error naming what could not be reached within connect_timeout.
  explicit worker_client(dist_options o, own_server colocated = {})
      : worker_join(std::move(o), std::move(colocated)) {
    thread_ = std::thread([this] { io_.run(); });
    try {
      join();
    } catch (...) {
      stop_io();
      throw;
    }
  }

  worker_client(const worker_client&) = delete;
  worker_client& operator=(const worker_client&) = delete;
  ~worker_client() { stop_io(); }

 private:
  std::span<std::byte> payload_sink(transport::connection&, const wire::header& h) override {
    if (h.command != wire::cmd::data || (h.flags & wire::flag_rows)) return {};
    std::lock_guard lk(m_);
    const request* p = pending_.find(h.req_id);
    if (!p || !p->out || !p->elem) return {};
    auto& r = *p;
    const std::uint64_t off = h.offset * r.elem;
    if (h.offset > r.out_bytes / r.elem || h.payload_len > r.out_bytes - off) return {};
    return {r.out + off, static_cast<std::size_t>(h.payload_len)};
  }

  void on_frame(transport::connection& c, const wire::header& h, std::string meta,
                std::span<const std::byte> payload) override {
    c.sync_with_direct_writes();  // an answer completes a request whose frames a caller wrote
    switch (h.command) {
      case wire::cmd::address_book:
        return on_address_book(h, meta);
      case wire::cmd::node_dead:
        return on_dead(static_cast<int>(h.key), meta);
      case wire::cmd::shutdown:
        return;
      case wire::cmd::response: {
        if ((h.flags & wire::flag_each) && h.status == 0 && h.aux > 1)
          return take_each(h.req_id, h.aux);
        auto r = take(h.req_id);
        if (!r) return;  // already failed (deadline) or an error answered earlier
        if (h.status != 0) {
          auto code = h.status <= static_cast<std::uint32_t>(errc::unsupported)
                          ? static_cast<errc>(h.status)
                          : errc::server_error;
          return r->done->complete_part(
              std::make_exception_ptr(error(code, r->what.str() + ": " + meta)));
        }
        try {
          if (r->on_text) r->on_text(meta);
          if (r->on_response) r->on_response(h, payload);
        } catch (...) {
          return r->done->complete_part(std::current_exception());
        }
        return r->done->complete_part();
      }
      case wire::cmd::data: {
        std::function<void(const wire::header&, std::span<const std::byte>)> on_data;
        bool direct = false;
        std::optional<request> bad;
        {
          std::lock_guard lk(m_);
          request* p = pending_.find(h.req_id);
          if (!p) return;
          auto& r = *p;
          on_data = r.on_data;
          direct =
              r.out && !(h.flags & wire::flag_rows) && payload.data() == r.out + h.offset * r.elem;
          if (!direct && !on_data && r.out)  // the sink refused it: it does not fit the buffer
            bad = pending_.take(h.req_id);
        }
        if (bad)  // completed without m_: a completion may run the key's next op, which sends
          return bad->done->complete_part(std::make_exception_ptr(
              error(errc::protocol, bad->what.str() + ": answer does not fit the output")));
        if (on_data) on_data(h, payload);
        if (h.flags & wire::flag_last)
          if (auto r = take(h.req_id)) r->done->complete_part();
        return;
      }
      default:
        (void)c;
        throw error(
            errc::protocol,
            "unexpected command " + std::to_string(static_cast<int>(h.command)) + " at a worker");
    }
  }

  void on_address_book(const wire::header& h, const std::string& meta) {
    auto book = wire::decode_address_book(meta);  // validated: counts, ranks, hosts, ports
    if (joined_) return on_new_address_book(book);
    num_workers_ = book.num_workers;
    std::vector<server_ref> servers(book.servers.size());
    for (std::size_t i = 0; i < servers.size(); ++i) {
      servers[i].rank = book.servers[i].rank;
      servers[i].id = book.servers[i].id;
      servers[i].host = std::move(book.servers[i].host);
      servers[i].port = book.servers[i].port;
    }
    {
      std::lock_guard lk(m_);
      servers_ = std::move(servers);
      id_ = static_cast<int>(h.key);
      rank_ = static_cast<int>(h.aux);
      credential_ = std::move(book.credential);
    }
    if (auto p = take(h.req_id)) p->done->complete_part();
  }

  // A server came back (restarted with its rank): reconnect to it and re-send what it had.
  void on_new_address_book(const wire::address_book& book) {
    for (std::size_t i = 0; i < servers_.size() && i < book.servers.size(); ++i) {
      auto& s = servers_[i];
      const auto& b = book.servers[i];
      if (!s.waiting && s.host == b.host && s.port == b.port) continue;
      {
        std::lock_guard lk(m_);
        s.host = b.host;
        s.port = b.port;
      }
      if (!s.waiting) continue;  // address changed while up: the old connection's loss follows
      transport::dial_once(
          io_, b.host, b.port, node_name(s.id), *this, data_limits(), worker_security(role::server),
          opts_.chunk_bytes,
          [this, i](std::shared_ptr<transport::connection> c, const std::string& why) {
            if (stopping_) return;
            if (!c)
              return detail::log_warn(
                  who_, "reconnecting to " + node_name(servers_[i].id) + " failed: " + why);
            reattach(i, std::move(c));
          });
    }
  }

  void reattach(std::size_t i, std::shared_ptr<transport::connection> c) {
    // Requests keep waiting (s.waiting) until the hello is queued on the new connection.
    attach(servers_[i], std::move(c), [this, i](hello_outcome o) {
      if (o.ok) resend(i);
    });
  }

  void resend(std::size_t i) {
    auto& s = servers_[i];
    std::vector<std::pair<std::uint64_t, std::vector<transport::out_frame>>> again;
    {
      std::lock_guard lk(m_);
      s.waiting = false;
      dead_.erase(s.id);
      again = pending_.frames_of(static_cast<int>(i));
    }
    for (auto& [id, frames] : again)
      for (auto& f : frames) s.conn->send(std::move(f));  // copies: the table keeps its own
    detail::log_warn(who_, node_name(s.id) + " is back: re-sent " + std::to_string(again.size()) +
                               " request(s)");
  }

  void on_dead(int id, const std::string& why) {
    {
      std::lock_guard lk(m_);
      dead_.insert(id);
    }
    // The scheduler stopped hearing from it: what waits on it fails now (its connection may
    // still be open: a paused server that resumes serves new requests again).
    for (std::size_t s = 0; s < servers_.size(); ++s)
      if (servers_[s].id == id && opts_.server_restart_wait.count() == 0)
        fail_pending(static_cast<int>(s), node_name(id) + " is dead (" + why + ")");
    if (id == scheduler_id) fail_pending(to_scheduler, "the scheduler is dead (" + why + ")");
  }

  void on_close(transport::connection& c, const std::string& reason) override {
    if (auto h = take_hello(c)) {  // closed before its handshake finished
      const bool joining = h->joining;
      h->then({false, reason, c.link_lost()});
      if (joining) return;  // join() reports it, or connects again
    }
    if (stopping_ || leaving_) return;
    if (&c == sched_.get()) {
      {
        std::lock_guard lk(m_);
        dead_.insert(scheduler_id);
      }
      detail::log_warn(who_, "lost the scheduler: " + reason);
      return fail_peer(to_scheduler, "connection to the scheduler lost (" + reason + ")");
    }
    for (std::size_t s = 0; s < servers_.size(); ++s)
      if (servers_[s].conn.get() == &c) {
        auto& sv = servers_[s];
        const std::string why = "connection to " + node_name(sv.id) + " at " + sv.host + ":" +
                                std::to_string(sv.port) + " lost (" + reason + ")";
        {
          std::lock_guard lk(m_);
          dead_.insert(sv.id);
          if (opts_.server_restart_wait.count() > 0) {
            sv.waiting = true;
            sv.lost_at = clock::now();
            sv.lost_why = why;
          }
        }
        if (opts_.server_restart_wait.count() > 0) {
          detail::log_warn(who_, why + "; waiting up to " +
                                     std::to_string(opts_.server_restart_wait.count()) +
                                     " ms for it to come back");
          return;
        }
        detail::log_warn(who_, "lost " + node_name(sv.id) + ": " + reason);
        fail_peer(static_cast<int>(s), why);
      }
  }

  void stop_io() {
    if (!thread_.joinable()) return;
    transport::asio::post(io_, [this] {
      stopping_ = true;
      timer_.cancel();
      if (sched_) sched_->close("worker leaving");
      for (auto& s : servers_)
        if (s.conn) s.conn->close("worker leaving");
    });
    work_.reset();
    // Give the closes a moment, then stop the loop.
    transport::asio::post(io_, [this] { io_.stop(); });
    thread_.join();
    // Anything still pending fails rather than hangs.
    std::vector<request> left;
    {
      std::lock_guard lk(m_);
      left = pending_.take_all();
    }
    for (auto& r : left)
      r.done->complete_part(std::make_exception_ptr(
          error(errc::shutdown, r.what.str() + ": the store is shutting down")));
  }
};

}  // namespace kvstore::detail
