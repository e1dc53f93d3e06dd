// The bodies of KVStore<dist, T>'s calls (decl/dist.hpp): each hands the call to the worker
// (client/worker_store.hpp). dist.hpp includes this file in header-only builds; with
// KVSTORE_SEPARATE_COMPILATION only <kvstore/src.hpp> does, and instantiates it for float and
// double. The constructor is the one place that decides what this process runs: a server or
// scheduler role (roles/spmd.hpp), a colocated server beside the worker (roles/colocated.hpp),
// then the worker.
#pragma once

#include <kvstore/client/worker_store.hpp>
#include <kvstore/decl/dist.hpp>
#include <kvstore/roles/colocated.hpp>
#include <kvstore/roles/spmd.hpp>
#include <kvstore/transport/tcp_congestion.hpp>

#include <memory>
#include <utility>

namespace kvstore {

template <class T>
KVStore<dist, T>::KVStore() : KVStore(dist_options::from_env()) {}

template <class T>
KVStore<dist, T>::KVStore(const dist_options& o) {
  if (o.role != role::worker) detail::run_role_and_exit(o);
  o.check_versions();
  transport::check_congestion(o.tcp_congestion);
  dist_options resolved = o;
  resolved.resolve_colocated();
  auto roles = resolved.colocated ? detail::start_colocated(resolved) : nullptr;
  impl_ = std::make_unique<detail::worker_store<T>>(resolved, std::move(roles));
}

template <class T>
KVStore<dist, T>::KVStore(KVStore&&) noexcept = default;
template <class T>
KVStore<dist, T>& KVStore<dist, T>::operator=(KVStore&&) noexcept = default;
template <class T>
KVStore<dist, T>::~KVStore() = default;

template <class T>
std::string KVStore<dist, T>::type() const {
  return impl_->type();
}
template <class T>
int KVStore<dist, T>::rank() const noexcept {
  return impl_->rank();
}
template <class T>
int KVStore<dist, T>::num_workers() const noexcept {
  return impl_->num_workers();
}
template <class T>
int KVStore<dist, T>::num_servers() const noexcept {
  return impl_->num_servers();
}
template <class T>
bool KVStore<dist, T>::colocated() const noexcept {
  return impl_->colocated();
}

template <class T>
void KVStore<dist, T>::init(key k, std::span<const T> value) {
  impl_->init(std::move(k), value);
}
template <class T>
void KVStore<dist, T>::init(key k, std::span<const T> value, std::size_t row_length) {
  impl_->init(std::move(k), value, row_length);
}
template <class T>
void KVStore<dist, T>::init(key k, std::span<const T> value, const init_options& o) {
  impl_->init(std::move(k), value, o);
}
template <class T>
void KVStore<dist, T>::init(std::span<const key> ks, std::span<const std::span<const T>> values) {
  impl_->init(ks, values);
}

template <class T>
op KVStore<dist, T>::push(key k, std::span<const T> value, int priority) {
  return impl_->push(std::move(k), value, priority);
}
template <class T>
op KVStore<dist, T>::push(key k, std::initializer_list<std::span<const T>> values, int priority) {
  return impl_->push(std::move(k), values, priority);
}
template <class T>
op KVStore<dist, T>::push(std::span<const key> ks, std::span<const std::span<const T>> values,
                          int priority) {
  return impl_->push(ks, values, priority);
}
template <class T>
op KVStore<dist, T>::pull(key k, std::span<T> out, int priority) {
  return impl_->pull(std::move(k), out, priority);
}
template <class T>
op KVStore<dist, T>::pull(key k, std::initializer_list<std::span<T>> outs, int priority) {
  return impl_->pull(std::move(k), outs, priority);
}
template <class T>
op KVStore<dist, T>::pull(std::span<const key> ks, std::span<const std::span<T>> outs,
                          int priority) {
  return impl_->pull(ks, outs, priority);
}
template <class T>
op KVStore<dist, T>::pull(key k, std::span<T> out, pull_options o) {
  return impl_->pull(std::move(k), out, o);
}
template <class T>
std::uint64_t KVStore<dist, T>::version(key k) {
  return impl_->version(std::move(k));
}
template <class T>
op KVStore<dist, T>::pushpull(key k, std::span<const T> value, std::span<T> out, int priority) {
  return impl_->pushpull(std::move(k), value, out, priority);
}

template <class T>
op KVStore<dist, T>::push_rows(key k, std::span<const std::int64_t> rows, std::span<const T> values,
                               int priority) {
  return impl_->push_rows(std::move(k), rows, values, priority);
}
template <class T>
op KVStore<dist, T>::pull_rows(key k, std::span<const std::int64_t> rows, std::span<T> out,
                               int priority) {
  return impl_->pull_rows(std::move(k), rows, out, priority);
}
template <class T>
std::pair<std::size_t, std::size_t> KVStore<dist, T>::slice_of(key k, int server) const {
  return impl_->slice_of(std::move(k), server);
}
template <class T>
op KVStore<dist, T>::push_range(key k, std::size_t offset, std::span<const T> values,
                                int priority) {
  return impl_->push_range(std::move(k), offset, values, priority);
}
template <class T>
op KVStore<dist, T>::pull_range(key k, std::size_t offset, std::span<T> out, int priority) {
  return impl_->pull_range(std::move(k), offset, out, priority);
}
template <class T>
void KVStore<dist, T>::wait(key k) {
  impl_->wait(std::move(k));
}
template <class T>
void KVStore<dist, T>::wait_all() {
  impl_->wait_all();
}

template <class T>
void KVStore<dist, T>::set_gradient_compression(const compression& c) {
  impl_->set_gradient_compression(c);
}
template <class T>
void KVStore<dist, T>::send_optimizer(const std::string& name, const std::string& params) {
  impl_->set_optimizer(name, params);
}
template <class T>
void KVStore<dist, T>::set_key_options(key k, const key_options& o) {
  impl_->set_key_options(std::move(k), o);
}
template <class T>
void KVStore<dist, T>::save_optimizer_states(const std::filesystem::path& path) {
  impl_->save_optimizer_states(path);
}
template <class T>
void KVStore<dist, T>::load_optimizer_states(const std::filesystem::path& path) {
  impl_->load_optimizer_states(path);
}

template <class T>
void KVStore<dist, T>::barrier() {
  impl_->barrier();
}
template <class T>
int KVStore<dist, T>::num_dead_node(int node_id, int timeout_sec) {
  return impl_->num_dead_node(node_id, timeout_sec);
}
template <class T>
void KVStore<dist, T>::send_command_to_servers(int head, std::string_view body) {
  impl_->send_command_to_servers(head, body);
}
template <class T>
void KVStore<dist, T>::set_barrier_before_exit(bool on) {
  impl_->set_barrier_before_exit(on);
}
template <class T>
void KVStore<dist, T>::leave() {
  impl_->leave();
}
template <class T>
bool KVStore<dist, T>::has_left() const noexcept {
  return impl_->has_left();
}
template <class T>
void KVStore<dist, T>::checkpoint() {
  impl_->checkpoint();
}

}  // namespace kvstore
