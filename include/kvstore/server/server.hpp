// A server process's node loop: registers with the scheduler, accepts workers (their hello proves
// their rank: transport/identity.hpp), sends heartbeats, follows membership (workers that leave,
// die or disconnect), and routes every other frame to its shard (server/shard.hpp), whose answers
// it writes back. It ends when the scheduler says the job is over. Snapshots: server/snapshots.hpp.
// Everything runs on one io thread, so the shard needs no locks (its apply pool's threads work
// only inside a call of the io thread: server/apply_pool.hpp). What it takes from dist_options:
// server/server_config.hpp; where the shard's answers go: server/connection_port.hpp.
#pragma once

#include <kvstore/detail/log.hpp>
#include <kvstore/node.hpp>
#include <kvstore/options.hpp>
#include <kvstore/server/connection_port.hpp>
#include <kvstore/server/server_config.hpp>
#include <kvstore/server/shard.hpp>
#include <kvstore/server/snapshots.hpp>
#include <kvstore/transport/connection.hpp>
#include <kvstore/transport/dial.hpp>
#include <kvstore/transport/identity.hpp>
#include <kvstore/transport/node_base.hpp>
#include <kvstore/wire/messages.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>

namespace kvstore {

class server final : public transport::node_base {
  using port_type = detail::connection_port;

 public:
  /// What a custom server does with kv.send_command_to_servers(head, body).
  using command_handler = std::function<void(int head, std::string_view body)>;

  /// Binds the listening socket at once. Throws kvstore::error(unreachable) when it cannot.
  explicit server(dist_options o)
      : node_base("server", detail::accept_rules_of(o), transport::bind_host(o.bind_host, o.token),
                  0, false,
                  "server cannot listen on " + transport::bind_host(o.bind_host, o.token)),
        opts_(std::move(o)),
        shard_(detail::shard_config_of(opts_),
               [this](bool important, std::uint64_t changes) {
                 snapshots_.changed(important, changes);
               }),
        snapshots_(shard_,
                   {opts_.checkpoint_dir, opts_.checkpoint_interval, opts_.checkpoint_rounds}) {
    const std::string host = transport::bind_host(opts_.bind_host, opts_.token);
    transport::tls_context(opts_.security(false));  // a bad TLS file is an error now, not later
    advertise_ = opts_.advertise_host.empty() ? (host == "0.0.0.0" ? std::string() : host)
                                              : opts_.advertise_host;
    if (opts_.token.empty() && host != "127.0.0.1")
      detail::log_warn("server", "no KVSTORE_TOKEN set but listening on " + host);
  }

  /// Registers the hook for send_command_to_servers (call before run()).
  void on_command(command_handler h) { on_command_ = std::move(h); }

  using node_base::port;
  /// The host this server registers for workers to reach it (empty: the scheduler uses the
  /// address it sees).
  const std::string& advertised_host() const noexcept { return advertise_; }
  int rank() const noexcept { return rank_; }
  /// The node id workers' hello proofs name (-1 until the address book or a rank hint sets it).
  int id() const noexcept { return id_; }

  /// Sets the job secret that checks workers' hellos (transport/identity.hpp), for a server
  /// driven without a scheduler (fuzzers, tests); the scheduler's address book sets it otherwise.
  /// Call from the io thread or before any connection.
  void use_job_secret(std::string secret) {
    if (secret.size() != transport::identity_size)
      throw error(errc::invalid_argument, "a job secret has 32 bytes");
    secret_ = std::move(secret);
  }

  /// Registers with the scheduler and serves until the job is over. Throws kvstore::error when
  /// the scheduler cannot be reached or is lost before the job ends.
  void run() {
    snapshots_.restore(opts_.rank_hint, opts_.num_workers);
    // The scheduler honours a valid rank hint; take it now, so a worker's frame that overtakes the
    // address book (separate connections, one io thread) already sees this server's identity.
    if (opts_.rank_hint >= 0 && opts_.rank_hint < opts_.num_servers)
      identify(detail::server_id(opts_.rank_hint), opts_.rank_hint);
    auto sec = opts_.security(false, role::scheduler);
    sec.self = role::server;
    sched_ = transport::dial(io_, opts_.scheduler_host, opts_.scheduler_port, opts_.connect_timeout,
                             "the scheduler", *this, detail::sched_limits(), sec);
    sched_->start();
    transport::out_frame reg;
    reg.h.command = wire::cmd::reg;
    reg.meta = wire::encode_registration(
        {role::server, opts_.rank_hint, advertise_, port(), opts_.num_workers, opts_.num_servers});
    sched_->send(std::move(reg));
    accept();
    tick();
    io_.run();
    if (!failure_.empty()) throw error(failure_code_, failure_);
  }

  /// Stops serving (from any thread).
  void stop() {
    transport::asio::post(io_, [this] { finish(""); });
  }

 private:
  void identify(int id, int rank) {
    id_ = id;
    rank_ = rank;
    who_ = "server " + std::to_string(rank_);
    shard_.name(who_);
    snapshots_.identify(rank_, who_);
  }

  std::size_t connections() const override { return workers_.size(); }
  void accepted(conn_ptr c) override { workers_.insert(std::move(c)); }
  void close_all() override {
    held_timer_.cancel();
    for (auto& c : workers_) c->close("server shutting down");
    if (sched_) sched_->close("server shutting down");
  }

  void tick() {
    timer_.expires_after(opts_.heartbeat_interval);
    timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || done_) return;
      if (!sched_lost_) {
        transport::out_frame f;
        f.h.command = wire::cmd::heartbeat;
        f.h.sender = id_;
        sched_->send(std::move(f));
      }
      snapshots_.tick();
      tick();
    });
  }

  std::span<std::byte> payload_sink(transport::connection& c, const wire::header& h) override {
    if (h.payload_len == 0 || &c == sched_.get()) return {};
    // Before its hello proved a rank a peer sends no payload: refused before any byte of it is
    // read, so a token holder's unidentified connection costs no more than its buffers.
    if (c.peer_id < 0) throw error(errc::protocol, "a payload before the hello");
    return shard_.sink(c.peer_rank, h);
  }

  void on_frame(transport::connection& c, const wire::header& h, std::string meta,
                std::span<const std::byte> payload) override {
    if (&c == sched_.get()) return on_scheduler(h, meta);
    if (c.peer_id < 0) {
      if (h.command != wire::cmd::hello) throw error(errc::protocol, "first frame must be hello");
      if (h.aux >= static_cast<std::uint64_t>(opts_.num_workers))
        throw error(errc::protocol, "hello from worker rank " + std::to_string(h.aux) +
                                        " but the job has " + std::to_string(opts_.num_workers));
      if (secret_.empty()) {
        // The worker's connection overtook this server's address book: nothing is read from it
        // until the book (and the job secret) arrive.
        c.pause_reading();
        early_hellos_.push_back({c.weak_from_this(), static_cast<int>(h.aux), std::move(meta)});
        return;
      }
      return hello(c, static_cast<int>(h.aux), meta);
    }
    try {
      handle(c, h, meta, payload);
    } catch (const error& e) {
      if (e.code() == make_error_code(errc::protocol)) throw;
      reply(c, h.req_id, static_cast<errc>(e.code().value()), e.what());
    }
    arm_held_timer();
  }

  // Pulls held for a version or slower workers fail at their deadline: a timer for the earliest.
  void arm_held_timer() {
    if (held_armed_ || done_) return;
    auto next = shard_.next_held_deadline();
    if (!next) return;
    held_armed_ = true;
    held_timer_.expires_at(*next);
    held_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || done_) return;
      held_armed_ = false;
      shard_.expire_held(std::chrono::steady_clock::now());
      arm_held_timer();
    });
  }

  // A worker's hello: the proof in its meta must come from the credential of the rank it claims,
  // for this connection and this server. A wrong or missing proof closes this connection only.
  // One connection per rank: a later one that proves the rank replaces the earlier (a worker that
  // reconnected), whose close then means nothing.
  void hello(transport::connection& c, int rank, const std::string& proof) {
    const int wid = detail::worker_id(rank);
    if (!transport::check_hello_proof(secret_, wid, rank, c.binding(), id_, proof)) {
      detail::log_warn(who_, "refused a connection from " + c.remote() + " claiming worker rank " +
                                 std::to_string(rank) + ": " + (proof.empty() ? "no" : "wrong") +
                                 " identity proof in its hello");
      throw error(errc::auth_failed, "hello claiming worker rank " + std::to_string(rank) +
                                         " without a valid identity proof");
    }
    auto& live = live_[rank];
    if (auto old = live.lock(); old && old.get() != &c) {
      detail::log_info(who_, "worker " + std::to_string(rank) + " reconnected from " + c.remote() +
                                 ": its connection from " + old->remote() + " is replaced");
      old->peer_id = -1;  // its close no longer speaks for the worker
      old->peer_rank = -1;
      old->close("replaced by a newer connection of worker " + std::to_string(rank));
      shard_.connection_lost(rank);
    }
    live = c.weak_from_this();
    c.peer_rank = rank;
    c.peer_id = wid;
    c.peer_role = static_cast<int>(role::worker);
  }

  void on_scheduler(const wire::header& h, const std::string& meta) {
    switch (h.command) {
      case wire::cmd::address_book: {
        auto book = wire::decode_address_book(meta);
        if (book.job_secret.size() != transport::identity_size)
          return finish("the scheduler's address book carries no job secret");
        identify(static_cast<int>(h.key), static_cast<int>(h.aux));
        secret_ = std::move(book.job_secret);
        detail::log_info(who_, "serving on port " + std::to_string(port()));
        // Hellos that came before the book are checked now, and their connections read on.
        auto early = std::move(early_hellos_);
        early_hellos_.clear();
        for (auto& e : early) {
          auto c = e.conn.lock();
          if (!c || c->is_closed()) continue;
          try {
            hello(*c, e.rank, e.proof);
          } catch (const error& err) {
            c->close(err.what());
            continue;
          }
          c->resume_reading();
        }
        return;
      }
      case wire::cmd::response:
        if (h.status != 0) {
          if (h.status <= static_cast<std::uint32_t>(errc::device_error) && h.status != 0)
            failure_code_ = static_cast<errc>(h.status);
          return finish("the scheduler refused this server: " + meta);
        }
        return;
      case wire::cmd::shutdown:
        return finish("");
      case wire::cmd::node_dead:
        return worker_gone(static_cast<int>(h.key), "died (" + meta + ")");
      case wire::cmd::leave:
        return worker_left(static_cast<int>(h.aux));
      default:
        return;
    }
  }

  void handle(transport::connection& c, const wire::header& h, std::string_view meta,
              std::span<const std::byte> payload) {
    switch (h.command) {
      case wire::cmd::command:
        return do_command(c, h, meta);
      case wire::cmd::leave:
        reply(c, h.req_id, errc::ok, {});
        return worker_left(c.peer_rank);
      case wire::cmd::bye:
        // A worker that is done pushes no more: the others' rounds go on without it.
        c.said_bye = true;
        reply(c, h.req_id, errc::ok, {});
        return worker_left(c.peer_rank);
      case wire::cmd::heartbeat:
        return;
      case wire::cmd::checkpoint:
        snapshots_.save();
        return reply(c, h.req_id, errc::ok, {});
      default:
        return shard_.handle(c.peer_rank, port_type{c.weak_from_this(), &id_}, h, meta, payload);
    }
  }

  void do_command(transport::connection& c, const wire::header& h, std::string_view meta) {
    if (!on_command_)
      throw error(errc::unsupported, who_ + " has no command handler (server::on_command)");
    try {
      on_command_(static_cast<int>(static_cast<std::int64_t>(h.key)), meta);
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      throw error(errc::server_error, who_ + ": command " +
                                          std::to_string(static_cast<std::int64_t>(h.key)) +
                                          " failed: " + e.what());
    }
    reply(c, h.req_id, errc::ok, {});
  }

  // Node `id` is gone: a worker either leaves the sync group or is dead (its rounds fail).
  void worker_gone(int id, const std::string& why) {
    if (id < 9 || id % 2 == 0) return;  // only workers matter to a server's rounds
    const int rank = (id - 9) / 2;
    if (shard_.has_left(rank) || shard_.is_dead(rank)) return;
    const std::string msg =
        "worker " + std::to_string(rank) + " (node " + std::to_string(id) + ") " + why;
    if (opts_.on_worker_death == worker_death::leave_group) {
      detail::log_warn(who_, msg + ": it leaves the sync group");
      return worker_left(rank);
    }
    shard_.worker_dead(rank, msg);
  }

  void worker_left(int rank) {
    if (rank < 0 || shard_.has_left(rank)) return;
    detail::log_info(who_, "worker " + std::to_string(rank) + " left the sync group");
    shard_.worker_left(rank);
  }

  void closed(transport::connection& c, const std::string& reason) override {
    if (c.peer_rank >= 0)
      if (auto it = live_.find(c.peer_rank);
          it != live_.end() && (it->second.expired() || it->second.lock().get() == &c))
        live_.erase(it);
    if (&c == sched_.get()) {
      if (done_) return;
      // Refused before it joined (a wrong token, the scheduler's connection cap): this server
      // serves no job, and says so (kv_server exits non-zero, so launchers see it).
      if (secret_.empty())
        return finish("the scheduler closed the connection before this server joined the job (" +
                      reason + ")");
      // Training needs no scheduler: serve on, and end once the workers are gone.
      sched_lost_ = true;
      detail::log_warn(who_,
                       "lost the scheduler (" + reason + "); serving on until the workers leave");
      if (workers_.empty()) finish("");
      return;
    }
    conn_ptr self;
    for (auto it = workers_.begin(); it != workers_.end(); ++it)
      if (it->get() == &c) {
        self = *it;
        workers_.erase(it);
        break;
      }
    if (done_) return;
    if (c.peer_rank >= 0) shard_.connection_lost(c.peer_rank);
    if (sched_lost_ && workers_.empty()) return finish("");
    if (c.peer_id < 0) {
      detail::log_warn(who_, "dropped connection from " + c.remote() + ": " + reason);
      return;
    }
    if (!c.said_bye) {
      detail::log_warn(who_, detail::node_name(c.peer_id) + " disconnected: " + reason);
      worker_gone(c.peer_id, "disconnected (" + reason + ")");
    }
  }

  void finish(const std::string& why) {
    if (done_) return;
    failure_ = why;
    if (!why.empty()) detail::log_warn(who_, why);
    finish_once();
  }

  dist_options opts_;
  std::string advertise_;
  conn_ptr sched_;
  std::set<conn_ptr> workers_;
  detail::shard<port_type> shard_;
  detail::snapshots<port_type> snapshots_;
  bool sched_lost_ = false;
  command_handler on_command_;
  int rank_ = -1;
  std::string failure_;
  errc failure_code_ = errc::node_dead;
  std::string secret_;  // the job secret from the address book: checks workers' hellos
  struct early_hello {
    std::weak_ptr<transport::connection> conn;
    int rank;
    std::string proof;
  };
  std::vector<early_hello> early_hellos_;  // hellos that came before the address book
  std::map<int, std::weak_ptr<transport::connection>> live_;  // each rank's verified connection
  transport::asio::steady_timer held_timer_{io_};             // the earliest held pull's deadline
  bool held_armed_ = false;
};

}  // namespace kvstore
