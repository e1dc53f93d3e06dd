// The bodies of decl/serve.hpp (serve.hpp includes them in header-only builds, src.hpp
// otherwise): a node_loop owns the scheduler (rendezvous/scheduler.hpp) or the server
// (server/server.hpp) of its options' role.
#pragma once

#include <kvstore/decl/serve.hpp>
#include <kvstore/detail/command_handlers.hpp>
#include <kvstore/error.hpp>
#include <kvstore/node.hpp>
#include <kvstore/rendezvous/scheduler.hpp>
#include <kvstore/server/server.hpp>

#include <memory>
#include <string>
#include <utility>

namespace kvstore {

struct node_loop::nodes {
  std::unique_ptr<scheduler> sched;
  std::unique_ptr<server> srv;
  std::string sched_host;  // a scheduler's, from its options
};

KVSTORE_DECL node_loop::node_loop(const dist_options& o) : nodes_(std::make_unique<nodes>()) {
  if (o.role == role::scheduler) {
    nodes_->sched = std::make_unique<scheduler>(o);
    nodes_->sched_host = o.scheduler_host;
  } else if (o.role == role::server) {
    nodes_->srv = std::make_unique<server>(o);
    if (auto h = detail::registered_command_handler()) nodes_->srv->on_command(std::move(h));
  } else {
    throw error(errc::invalid_argument,
                std::string("kvstore::node_loop: the role must be scheduler or server, not ") +
                    detail::role_name(o.role));
  }
}

KVSTORE_DECL node_loop::~node_loop() = default;

KVSTORE_DECL void node_loop::run() {
  if (nodes_->sched)
    nodes_->sched->run();
  else
    nodes_->srv->run();
}

KVSTORE_DECL void node_loop::stop() {
  if (nodes_->sched)
    nodes_->sched->stop();
  else
    nodes_->srv->stop();
}

KVSTORE_DECL std::uint16_t node_loop::port() const {
  return nodes_->sched ? nodes_->sched->port() : nodes_->srv->port();
}

KVSTORE_DECL std::uint64_t node_loop::accept_errors() const noexcept {
  return nodes_->sched ? nodes_->sched->accept_errors() : nodes_->srv->accept_errors();
}

KVSTORE_DECL std::string node_loop::advertised_host() const {
  return nodes_->sched ? nodes_->sched_host : nodes_->srv->advertised_host();
}

KVSTORE_DECL int node_loop::rank() const noexcept {
  return nodes_->sched ? 0 : nodes_->srv->rank();
}

KVSTORE_DECL void node_loop::on_command(command_handler h) {
  if (!nodes_->srv)
    throw error(errc::invalid_argument,
                "kvstore::node_loop::on_command: a scheduler runs no commands");
  nodes_->srv->on_command(std::move(h));
}

KVSTORE_DECL void serve(const dist_options& o) {
  node_loop n(o);
  n.run();
}

}  // namespace kvstore
