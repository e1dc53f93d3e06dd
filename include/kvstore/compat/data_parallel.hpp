// Torch cunn's DataParallelTable over a kvstore store: replicas of a model's (flat) parameters
// and gradients, one per device; acc_grad_parameters sums every replica's gradients into the
// primary's (replica 0) and zeroes the others', sync_parameters broadcasts the primary's
// parameters to every replica.
// Works over KVStore<device> (device_span buffers; the sum is one fused kernel on the primary's
// device with placement::first) and over KVStore<local> (std::span buffers). This header does not
// include device.hpp, so with the local store it compiles without CUDA or Thrust.
#pragma once

#include <kvstore/device/span.hpp>  // the vocabulary only: no Thrust, no CUDA
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvstore::compat {

namespace detail {
template <class Store>
struct table_traits;
template <class Mode, class T>
struct table_traits<KVStore<Mode, T>> {
  using value_type = T;
  static constexpr bool on_device = std::is_same_v<Mode, kvstore::device>;
  /// What one replica's buffer is: memory of a device, or host memory.
  using buffer = std::conditional_t<on_device, device_span<T>, std::span<T>>;
  using const_buffer = std::conditional_t<on_device, device_span<const T>, std::span<const T>>;
};

inline std::uint64_t next_table_id() {
  static std::atomic<std::uint64_t> n{0};
  return n++;
}
}  // namespace detail

/// DataParallelTable<Store>: Store is KVStore<device, T> or KVStore<local, T>. The table uses three
/// keys of the store of its own ("data_parallel.<n>.params", ".grads" and ".zeros"); use a store
/// without an optimizer for them (as with cunn, the caller updates the primary's parameters).
/// Not thread-safe; every call blocks until its work is done.
template <class Store>
class DataParallelTable {
  using traits = detail::table_traits<Store>;
  using T = typename traits::value_type;

 public:
  using buffer = typename traits::buffer;

  explicit DataParallelTable(Store& store)
      : store_(&store), prefix_("data_parallel." + std::to_string(detail::next_table_id())) {}

  /// Adds replica i (i = the number of replicas added before; 0 is the primary): its parameters
  /// and gradients, device_span<T> with KVStore<device>, anything that converts to std::span<T>
  /// with KVStore<local>. The table keeps views, not copies: the memory must outlive the table.
  /// The primary's values init the table's keys. Throws kvstore::error: size_mismatch (a
  /// replica's sizes differ from the primary's, or its parameters and gradients differ),
  /// invalid_argument (a device that is not the store's), and what the store's init throws.
  template <class P, class G>
  DataParallelTable& add(P&& params, G&& grads) {
    buffer p = as_buffer(std::forward<P>(params));
    buffer g = as_buffer(std::forward<G>(grads));
    if (size_of(p) != size_of(g))
      throw error(errc::size_mismatch, "kvstore: DataParallelTable::add: replica " +
                                           std::to_string(params_.size()) + " has " +
                                           std::to_string(size_of(p)) + " parameters and " +
                                           std::to_string(size_of(g)) + " gradients");
    if (!params_.empty() && size_of(p) != size_of(params_.front()))
      throw error(errc::size_mismatch,
                  "kvstore: DataParallelTable::add: replica " + std::to_string(params_.size()) +
                      " has " + std::to_string(size_of(p)) + " parameters, the primary " +
                      std::to_string(size_of(params_.front())));
    if constexpr (traits::on_device) {
      for (const auto* b : {&p, &g}) {
        const auto& ds = store_->devices();
        if (std::find(ds.begin(), ds.end(), b->device) == ds.end())
          throw error(errc::invalid_argument, "kvstore: DataParallelTable::add: replica " +
                                                  std::to_string(params_.size()) +
                                                  " is on device " + std::to_string(b->device) +
                                                  ", not one of the store's");
      }
    }
    if (params_.empty()) {
      store_->init(params_key(), as_const(p));
      store_->init(grads_key(), as_const(g));
      // What acc_grad_parameters pulls into the other replicas' gradients: a pull writes any
      // device's memory, where this header cannot (it includes no CUDA).
      const std::vector<T> zeros(size_of(g), T{});
      store_->init(zeros_key(), std::span<const T>(zeros));
    }
    params_.push_back(p);
    grads_.push_back(g);
    return *this;
  }

  /// (start, length) of part `index` of n items split `splits` ways, as cunn splits a batch: the
  /// first n % splits parts have one item more (10 over 3: (0, 4), (4, 3), (7, 3)).
  /// Throws kvstore::error(invalid_argument) for splits < 1 or index outside [0, splits).
  static std::pair<std::size_t, std::size_t> slice_range(std::size_t n, int index, int splits) {
    if (splits < 1 || index < 0 || index >= splits)
      throw error(errc::invalid_argument, "kvstore: DataParallelTable::slice_range: part " +
                                              std::to_string(index) + " of " +
                                              std::to_string(splits));
    const auto s = static_cast<std::size_t>(splits), i = static_cast<std::size_t>(index);
    const std::size_t base = n / s, extra = n % s;
    return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
  }

  /// The number of replicas added.
  std::size_t size() const noexcept { return params_.size(); }

  /// Sums every replica's gradients (in replica order) into the primary's gradients, then zeroes
  /// the other replicas' gradients, as cunn does after its reduce (DataParallelTable.lua,
  /// __backward: "Zero out gradients on the other GPUs", the fix of cunn issue #209): gradients
  /// accumulated over several passes between two calls are each counted once. Blocks until done.
  /// Throws kvstore::error(invalid_argument) with no replicas, and what the store's ops throw.
  void acc_grad_parameters() {
    check_replicas("acc_grad_parameters");
    std::vector<typename traits::const_buffer> in;
    for (auto& g : grads_) in.push_back(as_const(g));
    const std::vector<key> ks(in.size(), grads_key());
    store_->push(std::span<const key>(ks), std::span<const typename traits::const_buffer>(in))
        .wait();
    const key gk = grads_key();
    store_->pull(std::span<const key>(&gk, 1), std::span<const buffer>(&grads_.front(), 1)).wait();
    if (grads_.size() > 1) {
      const std::vector<key> zs(grads_.size() - 1, zeros_key());
      store_->pull(std::span<const key>(zs), std::span<const buffer>(grads_.data() + 1, zs.size()))
          .wait();
    }
    needs_sync_ = true;
  }

  /// Copies the primary's parameters to every other replica. Blocks until done.
  void sync_parameters() {
    check_replicas("sync_parameters");
    const key pk = params_key();
    const typename traits::const_buffer primary = as_const(params_.front());
    store_
        ->push(std::span<const key>(&pk, 1),
               std::span<const typename traits::const_buffer>(&primary, 1))
        .wait();
    if (params_.size() > 1) {
      const std::vector<key> ks(params_.size() - 1, pk);
      store_
          ->pull(std::span<const key>(ks),
                 std::span<const buffer>(params_.data() + 1, params_.size() - 1))
          .wait();
    }
    needs_sync_ = false;
  }

  /// True after acc_grad_parameters until the next sync_parameters.
  bool needs_sync() const noexcept { return needs_sync_; }

 private:
  key params_key() const { return key(prefix_ + ".params"); }
  key grads_key() const { return key(prefix_ + ".grads"); }
  key zeros_key() const { return key(prefix_ + ".zeros"); }

  template <class B>
  static buffer as_buffer(B&& b) {
    if constexpr (traits::on_device) {
      static_assert(std::is_convertible_v<B, device_span<T>>,
                    "DataParallelTable<KVStore<device>>: pass device_span<T>");
      return device_span<T>(std::forward<B>(b));
    } else {
      static_assert(std::is_convertible_v<B, std::span<T>>,
                    "DataParallelTable<KVStore<local>>: pass std::span<T>");
      return std::span<T>(std::forward<B>(b));
    }
  }
  static typename traits::const_buffer as_const(const buffer& b) {
    if constexpr (traits::on_device)
      return device_span<const T>{b.ptr, b.size, b.device, b.stream};
    else
      return std::span<const T>(b);
  }
  static std::size_t size_of(const buffer& b) {
    if constexpr (traits::on_device)
      return b.size;
    else
      return b.size();
  }
  void check_replicas(const char* call) const {
    if (params_.empty())
      throw error(errc::invalid_argument,
                  std::string("kvstore: DataParallelTable::") + call + ": no replicas added");
  }

  Store* store_;
  std::string prefix_;
  std::vector<buffer> params_, grads_;
  bool needs_sync_ = false;
};

}  // namespace kvstore::compat
