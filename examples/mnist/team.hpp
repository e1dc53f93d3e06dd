// One worker's compute threads. `team` runs a function on a fixed set of threads; `batch_team`
// uses it for a data-parallel step over the worker's slice of a global batch (forward, loss,
// backward) and hands each layer's gradients, summed over the threads, to a callback as soon as
// backprop has finished that layer, so the caller can push them while the earlier layers are
// still being computed. It knows nothing of the store.
#pragma once

#include "mnist/idx.hpp"
#include "mnist/mlp.hpp"

#include <algorithm>
#include <barrier>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

namespace mnist {

/// A fixed team of threads that runs one function on all of them and joins: the caller is
/// member 0. Kept alive across steps because a step is only a few milliseconds and starting
/// threads each time would show.
class team {
 public:
  explicit team(unsigned size) : size_(size) {
    for (unsigned i = 1; i < size_; ++i) helpers_.emplace_back([this, i] { serve(i); });
  }
  team(const team&) = delete;
  team& operator=(const team&) = delete;
  ~team() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  unsigned size() const { return size_; }

  /// Runs f(member) on every member and returns when all are done; rethrows the first exception.
  void run(const std::function<void(unsigned)>& f) {
    {
      std::lock_guard lk(m_);
      job_ = &f;
      pending_ = size_ - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    std::exception_ptr mine;
    try {
      f(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock lk(m_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void serve(unsigned member) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(unsigned)>* job = nullptr;
      {
        std::unique_lock lk(m_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      std::exception_ptr e;
      try {
        (*job)(member);
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard lk(m_);
      if (e && !error_) error_ = e;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  unsigned size_;
  std::vector<std::thread> helpers_;
  std::mutex m_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  const std::function<void(unsigned)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  unsigned pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

/// Compute threads for one of `workers` workers: `wanted`, or with 0 the cores shared evenly;
/// never more than the rows each step gives the worker.
inline unsigned threads_per_worker(unsigned wanted, int workers, std::size_t local_batch) {
  unsigned threads = wanted;
  if (threads == 0) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    threads = std::max(1u, cores / static_cast<unsigned>(workers));
  }
  return static_cast<unsigned>(std::min<std::size_t>(threads, local_batch));
}

/// A worker's data-parallel steps: each of `threads` members takes its share of the worker's
/// `local_batch` rows.
class batch_team {
 public:
  batch_team(const mlp& net, unsigned threads, std::size_t local_batch, std::size_t cols)
      : net_(net),
        crew_(threads),
        members_(threads),
        local_batch_(local_batch),
        per_member_((local_batch + threads - 1) / threads),
        layer_sync_(static_cast<std::ptrdiff_t>(threads)) {
    for (auto& m : members_) {
      m.ws = net.make_workspace(per_member_);
      m.x.resize(per_member_ * cols);
      m.y.resize(per_member_);
    }
  }

  unsigned threads() const { return crew_.size(); }

  /// One step on the samples rows[0 .. local_batch) of `train`. After each layer of backprop,
  /// once every member is past it (so its weights are no longer read this step and its gradients
  /// are final), member 0 sums the members' gradients of the layer and calls on_layer(layer);
  /// grad(t) then holds tensor t's sum. An exception from on_layer skips the later layers' calls
  /// and is rethrown once every member has finished the step (thrown at once, it would leave the
  /// others waiting at the next layer forever).
  void step(const mlp::tensors& params, const dataset& train, const std::size_t* rows,
            const std::function<void(std::size_t layer)>& on_layer) {
    std::exception_ptr error;
    crew_.run([&](unsigned t) {
      member& m = members_[t];
      const std::size_t begin = std::min(local_batch_, t * per_member_);
      const std::size_t n = std::min(local_batch_, begin + per_member_) - begin;
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t src = rows[begin + i];
        std::copy_n(train.images.data() + src * train.cols, train.cols,
                    m.x.data() + i * train.cols);
        m.y[i] = train.labels[src];
      }
      net_.forward(params, m.x.data(), n, m.ws);
      m.loss += net_.softmax_xent(m.y.data(), n, m.ws);
      net_.backward(params, m.x.data(), n, m.ws, [&](std::size_t layer) {
        layer_sync_.arrive_and_wait();
        if (t != 0 || error) return;
        try {
          for (std::size_t tensor : {2 * layer, 2 * layer + 1}) {
            std::vector<float>& g = members_[0].ws.grads[tensor];
            for (unsigned o = 1; o < members_.size(); ++o) {
              const std::vector<float>& go = members_[o].ws.grads[tensor];
              for (std::size_t i = 0; i < g.size(); ++i) g[i] += go[i];
            }
          }
          on_layer(layer);
        } catch (...) {
          error = std::current_exception();
        }
      });
    });
    if (error) std::rethrow_exception(error);
  }

  /// Tensor t's gradient summed over the members (valid from on_layer of its layer to the next
  /// step).
  const std::vector<float>& grad(std::size_t t) const { return members_[0].ws.grads[t]; }

  /// The summed softmax cross-entropy of this worker's samples since the last reset.
  double loss() const {
    double l = 0;
    for (const auto& m : members_) l += m.loss;
    return l;
  }
  void reset_loss() {
    for (auto& m : members_) m.loss = 0;
  }

  /// Fraction of `test` the model gets right, the rows spread over the members.
  double evaluate(const mlp::tensors& params, const dataset& test) {
    constexpr std::size_t chunk = 256;
    std::vector<std::size_t> correct(crew_.size(), 0);
    crew_.run([&](unsigned t) {
      auto ws = net_.make_workspace(chunk);
      const std::size_t per = (test.size() + crew_.size() - 1) / crew_.size();
      const std::size_t begin = std::min(test.size(), t * per);
      const std::size_t end = std::min(test.size(), begin + per);
      for (std::size_t s = begin; s < end; s += chunk) {
        const std::size_t n = std::min(chunk, end - s);
        net_.forward(params, test.images.data() + s * test.cols, n, ws);
        correct[t] += net_.correct(test.labels.data() + s, n, ws);
      }
    });
    const std::size_t total = std::accumulate(correct.begin(), correct.end(), std::size_t{0});
    return test.size() ? static_cast<double>(total) / static_cast<double>(test.size()) : 0.0;
  }

 private:
  /// Per-thread state: its rows of the current batch and its scratch.
  struct member {
    mlp::workspace ws;
    std::vector<float> x;
    std::vector<std::uint8_t> y;
    double loss = 0;
  };

  const mlp& net_;
  team crew_;
  std::vector<member> members_;
  std::size_t local_batch_, per_member_;
  std::barrier<> layer_sync_;
};

}  // namespace mnist
