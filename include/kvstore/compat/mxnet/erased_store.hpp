// The type erasure under compat/mxnet.hpp's KVStore: one virtual interface with the calls MXNet's
// KVStore has, and a model that forwards each to a concrete store (KVStore<local>, <dist> or
// <device>). Nothing is implemented here; every call is the store's own.
#pragma once

#include <kvstore/dist.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/optim/optimizer.hpp>
#include <kvstore/options.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kvstore::compat::mxnet::detail {

/// The calls of a store of float values that MXNet's KVStore needs, whatever its mode.
class erased_store {
 public:
  using dist_store = kvstore::KVStore<kvstore::dist, float>;
  /// How an optimizer reaches the store: as an updater (local and device stores) or, for a dist
  /// store, as its registered type (it travels to the servers as name and parameters).
  using set_on_dist = std::function<void(dist_store&)>;

  virtual ~erased_store() = default;
  virtual int rank() const = 0;
  virtual int num_workers() const = 0;
  virtual void init(std::span<const key> ks, std::span<const std::span<const float>> values) = 0;
  virtual void init_rows(key k, std::span<const float> value, std::size_t row_length) = 0;
  virtual op push(std::span<const key> ks, std::span<const std::span<const float>> values,
                  int priority) = 0;
  virtual op pull(std::span<const key> ks, std::span<const std::span<float>> outs,
                  int priority) = 0;
  virtual op pull_rows(key k, std::span<const std::int64_t> rows, std::span<float> out,
                       int priority) = 0;
  virtual void set_optimizer(optim::updater<float> u, const set_on_dist& on_dist) = 0;
  virtual void save_optimizer_states(const std::filesystem::path& path) = 0;
  virtual void load_optimizer_states(const std::filesystem::path& path) = 0;
  virtual void barrier() = 0;
  virtual void send_command_to_servers(int head, std::string_view body) = 0;
  virtual int num_dead_node(int node_id, int timeout_sec) = 0;
  virtual void set_barrier_before_exit(bool on) = 0;
  virtual void set_gradient_compression(const compression& c) = 0;
};

/// erased_store over `Store`, which it owns (constructed from `args`).
template <class Store>
class store_model final : public erased_store {
 public:
  template <class... Args>
  explicit store_model(Args&&... args) : store_(std::forward<Args>(args)...) {}

  int rank() const override { return store_.rank(); }
  int num_workers() const override { return store_.num_workers(); }
  void init(std::span<const key> ks, std::span<const std::span<const float>> values) override {
    store_.init(ks, values);
  }
  void init_rows(key k, std::span<const float> value, std::size_t row_length) override {
    store_.init(std::move(k), value, row_length);
  }
  op push(std::span<const key> ks, std::span<const std::span<const float>> values,
          int priority) override {
    return store_.push(ks, values, priority);
  }
  op pull(std::span<const key> ks, std::span<const std::span<float>> outs, int priority) override {
    return store_.pull(ks, outs, priority);
  }
  op pull_rows(key k, std::span<const std::int64_t> rows, std::span<float> out,
               int priority) override {
    return store_.pull_rows(std::move(k), rows, out, priority);
  }
  void set_optimizer(optim::updater<float> u, const set_on_dist& on_dist) override {
    if constexpr (std::is_same_v<Store, dist_store>)
      on_dist(store_);
    else
      store_.set_optimizer(std::move(u));
  }
  void save_optimizer_states(const std::filesystem::path& path) override {
    store_.save_optimizer_states(path);
  }
  void load_optimizer_states(const std::filesystem::path& path) override {
    store_.load_optimizer_states(path);
  }
  void barrier() override { store_.barrier(); }
  void send_command_to_servers(int head, std::string_view body) override {
    // MXNet's KVStore base class does nothing without servers (include/mxnet/kvstore.h).
    if constexpr (std::is_same_v<Store, dist_store>) store_.send_command_to_servers(head, body);
  }
  int num_dead_node(int node_id, int timeout_sec) override {
    return store_.num_dead_node(node_id, timeout_sec);
  }
  void set_barrier_before_exit(bool on) override { store_.set_barrier_before_exit(on); }
  void set_gradient_compression(const compression& c) override {
    store_.set_gradient_compression(c);
  }

 private:
  Store store_;
};

}  // namespace kvstore::compat::mxnet::detail
