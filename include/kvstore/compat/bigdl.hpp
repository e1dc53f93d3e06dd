// BigDL's AllReduceParameter over a KVStore<dist> with colocated servers (BigDL's layout: every
// node holds one partition of each parameter, so partition id == worker rank == server rank). A
// parameter is a 1-D vector of `size` elements cut by BigDL's chunk rule (chunk i starts at
// i*floor(n/P) + min(i, n mod P) and is floor(n/P) + (i < n mod P) long) into P partitions, one
// per node. Each iteration of BigDL's DistriOptimizer is, on every node:
//   get_weights(local)                 the whole weight vector, every chunk compressed
//   put_gradients(grad)                the node's whole gradient, compressed
//   aggregate_gradient_partition(n)    this node's chunk: the sum over the nodes / n, full
//   precision (the optimizer steps weight_partition() with gradient_partition(), on the node)
//   send_weight_partition()            publishes this node's updated chunk
//
// A thin layer: every call is a call of the store. Parameter `id` is two keys, each inited with
// init_options{.partition = partition::even, .compression = the parameter's}, so chunk i of both
// lives on server i (this node's own server for its own chunk):
//   "bigdl.AllReduceParameter.<id>.gradient"  put_gradients pushes the whole gradient (compressed
//       frames, one per server); a dist_sync round with no optimizer stores the sum over the
//       workers, decoded and summed in T on the server; the owner pulls its chunk of it
//       (pull_range: plain, at full precision). Deviation: BigDL sums the 16-bit forms in
//       partition-id order, truncating after each add (FP16CompressedTensor), so small parts can
//       vanish there (1 + 2^-8 + 2^-8 is 1.0 in BigDL, 1.0078125 here).
//   "bigdl.AllReduceParameter.<id>.weight"    init keeps, as BigDL's, each node's chunk of its own
//       parameter (the nodes' parameters may differ): the master chunk (weight_partition())
//       lives on the node at full precision (BigDL learned that truncated masters break ImageNet
//       convergence), and init publishes it as a send does. send_weight_partition pushes the whole
//       key with the node's chunk in place and zeros elsewhere: the round's sum is every node's
//       chunk, compressed once on the wire (a dist_sync round needs a push from every worker to
//       every slice, so a range push of one's own chunk alone would never complete it). get_weights
//       pulls the whole key compressed: the local copies hold the compressed value.
// The store must have no optimizer set (BigDL runs its optimizer on the node, not on the
// servers), must run dist_sync, and must have as many servers as workers (colocated:
// kv_launch --colocated, KVSTORE_COLOCATED=1, dist_options::colocated); compress::none follows
// the store's set_gradient_compression (none unless it was called).
#pragma once

#include <kvstore/error.hpp>
#include <kvstore/key.hpp>
#include <kvstore/kvstore.hpp>  // the colocated server: this node's partition is served here
#include <kvstore/op.hpp>
#include <kvstore/options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvstore::compat::bigdl {

/// BigDL's compression of a parameter on the wire. fp16 is BigDL's FP16CompressedTensor: the high
/// 16 bits of the float (truncation; kvstore's compression::bf16_trunc), not IEEE half. bf16 is
/// bfloat16 rounded to nearest even. none travels plain (or as the store's setting, if any).
enum class compress { none, fp16, bf16 };

/// BigDL's (partitionId, start, length) of one chunk: elements [start, start + length).
struct partition_info {
  int partition_id = 0;
  std::size_t start = 0, length = 0;
  friend bool operator==(const partition_info&, const partition_info&) = default;
};

/// Chunk `partition_id` of `size` elements over `partition_num` partitions, BigDL's rule: start
/// i*floor(n/P) + min(i, n mod P), length floor(n/P) + (i < n mod P) (10 over 3: (0, 0, 4), (1,
/// 4, 3), (2, 7, 3); 2 over 4: lengths 1, 1, 0, 0, an empty chunk starting at 2). Throws
/// kvstore::error(invalid_argument) for partition_num < 1 or partition_id outside [0,
/// partition_num).
inline partition_info chunk_of(int partition_id, int partition_num, std::size_t size) {
  if (partition_num < 1 || partition_id < 0 || partition_id >= partition_num)
    throw error(errc::invalid_argument,
                "kvstore: bigdl: chunk_of: partition " + std::to_string(partition_id) + " of " +
                    std::to_string(partition_num) + " (partition ids are 0 .. partition_num - 1)");
  const auto i = static_cast<std::size_t>(partition_id);
  const auto p = static_cast<std::size_t>(partition_num);
  const std::size_t base = size / p, extra = size % p;
  return {partition_id, i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

/// The store's compression for BigDL's name. Throws invalid_argument for a value outside the enum.
inline compression to_compression(compress c) {
  switch (c) {
    case compress::none:
      return {compression::none};
    case compress::fp16:
      return {compression::bf16_trunc};
    case compress::bf16:
      return {compression::bf16};
  }
  throw error(errc::invalid_argument, "kvstore: bigdl: compress " +
                                          std::to_string(static_cast<int>(c)) +
                                          " is not one of none, fp16, bf16");
}

/// One parameter (a 1-D vector) shared by the nodes of a colocated dist_sync job. Every worker
/// constructs it with the same id, partition_num and size and calls init, then the calls of each
/// iteration in BigDL's order (see the top of the file). One thread uses an instance at a time.
/// Errors are kvstore::error naming "AllReduceParameter <id>" and the problem; errors of the
/// store's ops (a server lost, a deadline) surface at the next call that waits for them.
template <class T = float>
class AllReduceParameter {
 public:
  using store_type = KVStore<dist, T>;

  /// Throws kvstore::error(invalid_argument): size 0, a compress value outside the enum, a store
  /// not in dist_sync, partition_num not the store's number of servers, or a job whose servers
  /// are not one per worker (BigDL's layout: colocated servers, server rank == worker rank).
  AllReduceParameter(store_type& store, std::int64_t id, int partition_num, std::size_t size,
                     compress c = compress::fp16)
      : store_(store),
        id_(id),
        partition_num_(partition_num),
        size_(size),
        compress_(c),
        weight_key_(key_name("weight")),
        gradient_key_(key_name("gradient")) {
    if (c != compress::none && c != compress::fp16 && c != compress::bf16)
      fail(errc::invalid_argument, "constructor",
           "compress " + std::to_string(static_cast<int>(c)) + " is not one of none, fp16, bf16");
    if (size == 0)
      fail(errc::invalid_argument, "constructor", "size 0 (a parameter needs elements)");
    if (store.type() != "dist_sync")
      fail(errc::invalid_argument, "constructor",
           "the store runs " + store.type() +
               "; BigDL's gradient rounds need dist_sync (every node's gradient summed once)");
    if (partition_num != store.num_servers())
      fail(errc::invalid_argument, "constructor",
           "partition_num " + std::to_string(partition_num) + " differs from the job's " +
               std::to_string(store.num_servers()) +
               " servers (BigDL: one partition per node, chunk i on server i)");
    if (store.num_servers() != store.num_workers())
      fail(errc::invalid_argument, "constructor",
           "the job has " + std::to_string(store.num_workers()) + " workers and " +
               std::to_string(store.num_servers()) +
               " servers; partition id == rank needs one server per worker (colocated: "
               "kv_launch --colocated, KVSTORE_COLOCATED=1)");
  }

  AllReduceParameter(const AllReduceParameter&) = delete;
  AllReduceParameter& operator=(const AllReduceParameter&) = delete;

  /// Waits for the pushes in flight (they read this object's buffers). Never throws.
  ~AllReduceParameter() {
    settle(gradient_push_);
    settle(weight_push_);
  }

  /// BigDL's init(parameter), on every node before the first iteration: weight_partition()
  /// becomes this node's chunk of its own `parameter` (full precision), published as the
  /// weights' chunk (compressed, as a send), gradients zero, both keys cut into BigDL's chunks
  /// over the servers; returns (partition id == store.rank(), start, length). The nodes'
  /// parameters may differ: the weights are each owner's chunk of its own (BigDL's
  /// AllReduceParameter.init copies parameter.narrow(start, length)). Blocks until every
  /// worker's init is done (a round of the weights). Throws kvstore::error: already_inited
  /// (init twice), size_mismatch (parameter.size() != size), what the store's calls throw.
  partition_info init(std::span<const T> parameter) {
    if (inited_) fail(errc::already_inited, "init", "init twice");
    check_size("init", "parameter", parameter.size());
    const init_options o{.partition = kvstore::partition::even,
                         .compression = to_compression(compress_)};
    publish_.assign(size_, T{});  // zeros: both keys' first value, then sends' scratch
    store_.init(weight_key_, std::span<const T>(publish_), o);
    store_.init(gradient_key_, std::span<const T>(publish_), o);
    part_ = chunk_of(store_.rank(), partition_num_, size_);
    // The store's chunks are BigDL's; checked, since a mismatch would mix up partitions silently.
    const auto [start, length] = store_.slice_of(weight_key_, part_.partition_id);
    if (length != part_.length || (length && start != part_.start))
      fail(errc::invalid_argument, "init",
           "the store placed chunk " + std::to_string(part_.partition_id) + " at (" +
               std::to_string(start) + ", " + std::to_string(length) + "), BigDL's rule says (" +
               std::to_string(part_.start) + ", " + std::to_string(part_.length) + ")");
    const auto mine = parameter.subspan(part_.start, part_.length);
    weight_partition_.assign(mine.begin(), mine.end());
    gradient_partition_.assign(part_.length, T{});
    gradients_.assign(size_, T{});
    inited_ = true;
    send_weight_partition();  // every node's chunk in place: the weights' first round
    weight_push_.wait();
    return part_;
  }

  /// BigDL's getWeights(localParameter): every chunk of the weights, as the owners last sent them
  /// (or as init stored them), pulled compressed into `local` (size elements). Returns at once
  /// (BigDL's FutureResult): read `local` once the op is done; its wait() also throws an error
  /// of this node's last send_weight_partition. Throws kvstore::error: unknown_key (before
  /// init), size_mismatch.
  op get_weights(std::span<T> local) {
    check_inited("get_weights");
    check_size("get_weights", "local", local.size());
    // The store runs one key's ops in order: the send before this pull is done when it runs.
    return store_.pull(weight_key_, local).then([sent = weight_push_](std::exception_ptr e) {
      if (!e) sent.wait();
    });
  }

  /// BigDL's putGradients(gradient): this node's gradient of the whole parameter (size elements)
  /// to every chunk's owner, compressed. Copies `gradients` and returns once the push is issued.
  /// Throws kvstore::error: unknown_key (before init), size_mismatch, the error of this node's
  /// previous put_gradients.
  void put_gradients(std::span<const T> gradients) {
    check_inited("put_gradients");
    check_size("put_gradients", "gradients", gradients.size());
    gradient_push_.wait();  // it reads gradients_
    std::copy(gradients.begin(), gradients.end(), gradients_.begin());
    gradient_push_ = store_.push(gradient_key_, std::span<const T>(gradients_));
  }

  /// BigDL's aggregateGradientPartition(avgNumbers): waits until every node's gradient of this
  /// round is in, then gradient_partition() = (their sum over this node's chunk) / avg_numbers,
  /// at full precision. Throws kvstore::error: unknown_key (before init), invalid_argument
  /// (avg_numbers < 1), the error of this node's put_gradients or of the pull (a deadline: a node
  /// that did not put its gradients).
  void aggregate_gradient_partition(int avg_numbers) {
    check_inited("aggregate_gradient_partition");
    if (avg_numbers < 1)
      fail(errc::invalid_argument, "aggregate_gradient_partition",
           "avg_numbers " + std::to_string(avg_numbers) + " (the sum is divided by it: >= 1)");
    gradient_push_.wait();  // a dist_sync push is answered once its round is complete
    if (part_.length) store_.pull_range(gradient_key_, part_.start, gradient_partition_).wait();
    // Divided, as BigDL's gradientPartition.div(avgNumbers): (0.1f * 3) / 3 is 0.1f again, a
    // multiplication by 1/3 is not.
    const T n = static_cast<T>(avg_numbers);
    if (avg_numbers != 1)
      for (T& g : gradient_partition_) g /= n;
  }

  /// BigDL's weightPartition: this node's chunk of the weights at full precision, which its
  /// optimizer steps in place before send_weight_partition. Empty when the chunk is (fewer
  /// elements than partitions). Throws unknown_key before init.
  std::span<T> weight_partition() {
    check_inited("weight_partition");
    return weight_partition_;
  }

  /// BigDL's gradientPartition: this node's chunk of the aggregated gradient (after
  /// aggregate_gradient_partition). Throws unknown_key before init.
  std::span<T> gradient_partition() {
    check_inited("gradient_partition");
    return gradient_partition_;
  }

  /// BigDL's sendWeightPartition: publishes weight_partition() as this node's chunk of the
  /// weights (compressed on the wire; weight_partition() itself keeps full precision). Every node
  /// sends once per iteration (a dist_sync round of the weights); the next get_weights sees every
  /// node's chunk. Returns once the push is issued. Throws kvstore::error: unknown_key (before
  /// init), the error of this node's previous send.
  void send_weight_partition() {
    check_inited("send_weight_partition");
    weight_push_.wait();  // it reads publish_
    std::copy(weight_partition_.begin(), weight_partition_.end(),
              publish_.begin() + static_cast<std::ptrdiff_t>(part_.start));
    weight_push_ = store_.push(weight_key_, std::span<const T>(publish_));
  }

  // ---- additions ------------------------------------------------------------------------------
  std::int64_t id() const noexcept { return id_; }
  int partition_num() const noexcept { return partition_num_; }
  std::size_t size() const noexcept { return size_; }
  compress compression_type() const noexcept { return compress_; }
  /// This node's (partition id, start, length); unknown_key before init.
  partition_info partition() const {
    check_inited("partition");
    return part_;
  }
  /// The store's keys of this parameter (for version(), say).
  const key& weight_key() const noexcept { return weight_key_; }
  const key& gradient_key() const noexcept { return gradient_key_; }

 private:
  std::string key_name(const char* what) const {
    return "bigdl.AllReduceParameter." + std::to_string(id_) + "." + what;
  }

  [[noreturn]] void fail(errc c, const char* call, const std::string& problem) const {
    throw error(c, "kvstore: bigdl: AllReduceParameter " + std::to_string(id_) + ": " + call +
                       ": " + problem);
  }
  void check_inited(const char* call) const {
    if (!inited_) fail(errc::unknown_key, call, "called before init(parameter)");
  }
  void check_size(const char* call, const char* what, std::size_t n) const {
    if (n != size_)
      fail(errc::size_mismatch, call,
           std::string(what) + " has " + std::to_string(n) + " elements, the parameter " +
               std::to_string(size_));
  }
  static void settle(const op& o) noexcept {
    try {
      o.wait();
    } catch (...) {
    }
  }

  store_type& store_;
  const std::int64_t id_;
  const int partition_num_;
  const std::size_t size_;
  const compress compress_;
  const key weight_key_, gradient_key_;
  bool inited_ = false;
  partition_info part_;
  std::vector<T> weight_partition_, gradient_partition_;
  std::vector<T> gradients_;  // the pushed copy of put_gradients' argument
  std::vector<T> publish_;    // zeros but this node's chunk: what send_weight_partition pushes
  op gradient_push_, weight_push_;
};

}  // namespace kvstore::compat::bigdl
