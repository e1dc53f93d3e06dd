// A multi-layer perceptron in plain C++: dense layers, ReLU between them, softmax cross-entropy
// on top. Forward and backward on a mini-batch; no framework, no BLAS.
//
// Layout. Layer l maps `in` features to `out`: its weight is one tensor of in x out floats,
// row-major (row k holds the weights from input k to every output), its bias one of `out`. With
// that layout the forward product and the weight gradient both run their innermost loop over
// contiguous outputs, which vectorizes without -ffast-math; the input gradient needs W^T, which is
// transposed once per batch into scratch (cheap next to the products).
//
// Speed. The products go through register-tiled kernels (4 rows x 16 columns of the output held
// in registers across the whole reduction), so each loaded weight feeds 4 FMAs. On
// x86-64 with GCC the kernels are also compiled for Haswell-class CPUs (AVX2 + FMA) and picked at
// load time (target_clones), so the binary stays portable without -march=native.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// Not under sanitizers: ifunc resolvers run before the sanitizer runtime is up.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define MNIST_KERNEL __attribute__((target_clones("arch=haswell", "default")))
#else
#define MNIST_KERNEL
#endif

namespace mnist {

namespace kernel {

constexpr std::size_t tile_cols = 16;

// The micro-kernels below hold a 4 x 16 block of the output in four named 16-float arrays rather
// than one float[4][16]: GCC keeps the named ones in vector registers across the whole reduction
// loop, while the 2-D array ends up on the stack (measured: 3x slower). __restrict tells the
// vectorizer the output never aliases the inputs.

/// Plain loops for the ragged edges: C[i_begin..i_end) x [j_begin..j_end) of A * B (+ bias).
inline void gemm_nn_edge(const float* a, const float* b, const float* bias, float* c, std::size_t k,
                         std::size_t n, std::size_t i_begin, std::size_t i_end, std::size_t j_begin,
                         std::size_t j_end) {
  for (std::size_t i = i_begin; i < i_end; ++i) {
    float* crow = c + i * n;
    for (std::size_t j = j_begin; j < j_end; ++j) crow[j] = bias ? bias[j] : 0.0f;
    for (std::size_t p = 0; p < k; ++p) {
      const float av = a[i * k + p];
      const float* brow = b + p * n;
      for (std::size_t j = j_begin; j < j_end; ++j) crow[j] += av * brow[j];
    }
  }
}

/// C[m x n] = A[m x k] * B[k x n] (+ bias[n] broadcast over rows if bias != nullptr). Row-major,
/// leading dimensions equal to the widths.
MNIST_KERNEL inline void gemm_nn(const float* __restrict a, const float* __restrict b,
                                 const float* __restrict bias, float* __restrict c, std::size_t m,
                                 std::size_t k, std::size_t n) {
  const std::size_t n_full = n - n % tile_cols;
  const std::size_t m_full = m - m % 4;
  // Column panels outermost: a panel of B (k x 16 floats, 50 KB for k = 784) stays in cache
  // while every row block of A streams past it.
  for (std::size_t j0 = 0; j0 < n_full; j0 += tile_cols) {
    for (std::size_t i0 = 0; i0 < m_full; i0 += 4) {
      float c0[tile_cols];
      float c1[tile_cols];
      float c2[tile_cols];
      float c3[tile_cols];
      for (std::size_t j = 0; j < tile_cols; ++j) {
        const float init = bias ? bias[j0 + j] : 0.0f;
        c0[j] = c1[j] = c2[j] = c3[j] = init;
      }
      const float* a0 = a + i0 * k;
      for (std::size_t p = 0; p < k; ++p) {
        const float* brow = b + p * n + j0;
        const float x0 = a0[p];
        const float x1 = a0[k + p];
        const float x2 = a0[2 * k + p];
        const float x3 = a0[3 * k + p];
        for (std::size_t j = 0; j < tile_cols; ++j) {
          c0[j] += x0 * brow[j];
          c1[j] += x1 * brow[j];
          c2[j] += x2 * brow[j];
          c3[j] += x3 * brow[j];
        }
      }
      for (std::size_t j = 0; j < tile_cols; ++j) {
        c[i0 * n + j0 + j] = c0[j];
        c[(i0 + 1) * n + j0 + j] = c1[j];
        c[(i0 + 2) * n + j0 + j] = c2[j];
        c[(i0 + 3) * n + j0 + j] = c3[j];
      }
    }
  }
  if (n_full < n) gemm_nn_edge(a, b, bias, c, k, n, 0, m_full, n_full, n);
  if (m_full < m) gemm_nn_edge(a, b, bias, c, k, n, m_full, m, 0, n);
}

/// Plain loops for the ragged edges of gemm_tn: rows [p_begin, p_end) x [j_begin, j_end) of C.
inline void gemm_tn_edge(const float* a, const float* d, float* c, std::size_t m, std::size_t k,
                         std::size_t n, std::size_t p_begin, std::size_t p_end, std::size_t j_begin,
                         std::size_t j_end) {
  for (std::size_t p = p_begin; p < p_end; ++p) {
    float* crow = c + p * n;
    for (std::size_t j = j_begin; j < j_end; ++j) crow[j] = 0.0f;
    for (std::size_t i = 0; i < m; ++i) {
      const float av = a[i * k + p];
      const float* drow = d + i * n;
      for (std::size_t j = j_begin; j < j_end; ++j) crow[j] += av * drow[j];
    }
  }
}

/// C[k x n] = A[m x k]^T * D[m x n]: the weight gradient, summed over the m rows of the batch.
MNIST_KERNEL inline void gemm_tn(const float* __restrict a, const float* __restrict d,
                                 float* __restrict c, std::size_t m, std::size_t k, std::size_t n) {
  const std::size_t n_full = n - n % tile_cols;
  const std::size_t k_full = k - k % 4;
  for (std::size_t p0 = 0; p0 < k_full; p0 += 4) {
    for (std::size_t j0 = 0; j0 < n_full; j0 += tile_cols) {
      float c0[tile_cols] = {};
      float c1[tile_cols] = {};
      float c2[tile_cols] = {};
      float c3[tile_cols] = {};
      for (std::size_t i = 0; i < m; ++i) {
        const float* arow = a + i * k + p0;
        const float* drow = d + i * n + j0;
        const float x0 = arow[0];
        const float x1 = arow[1];
        const float x2 = arow[2];
        const float x3 = arow[3];
        for (std::size_t j = 0; j < tile_cols; ++j) {
          c0[j] += x0 * drow[j];
          c1[j] += x1 * drow[j];
          c2[j] += x2 * drow[j];
          c3[j] += x3 * drow[j];
        }
      }
      for (std::size_t j = 0; j < tile_cols; ++j) {
        c[p0 * n + j0 + j] = c0[j];
        c[(p0 + 1) * n + j0 + j] = c1[j];
        c[(p0 + 2) * n + j0 + j] = c2[j];
        c[(p0 + 3) * n + j0 + j] = c3[j];
      }
    }
  }
  if (n_full < n) gemm_tn_edge(a, d, c, m, k, n, 0, k_full, n_full, n);
  if (k_full < k) gemm_tn_edge(a, d, c, m, k, n, k_full, k, 0, n);
}

/// out[n x k] = in[k x n]^T, in 16 x 16 blocks so both sides are touched a cache line at a time.
inline void transpose(const float* in, float* out, std::size_t k, std::size_t n) {
  constexpr std::size_t blk = 16;
  for (std::size_t p0 = 0; p0 < k; p0 += blk)
    for (std::size_t j0 = 0; j0 < n; j0 += blk)
      for (std::size_t p = p0; p < std::min(p0 + blk, k); ++p)
        for (std::size_t j = j0; j < std::min(j0 + blk, n); ++j) out[j * k + p] = in[p * n + j];
}

}  // namespace kernel

/// The network's shape and the indexing of its parameter tensors: tensor 2l is layer l's weight
/// (in x out), tensor 2l+1 its bias (out). Parameters and gradients are both held as one
/// std::vector<float> per tensor, which is what a parameter server pushes and pulls per key.
class mlp {
 public:
  using tensors = std::vector<std::vector<float>>;

  /// sizes = {inputs, hidden..., classes}, e.g. {784, 256, 128, 10}.
  explicit mlp(std::vector<std::size_t> sizes) : sizes_(std::move(sizes)) {
    if (sizes_.size() < 2) throw std::invalid_argument("mlp: needs at least input and output size");
    for (std::size_t s : sizes_)
      if (s == 0) throw std::invalid_argument("mlp: a layer of size 0");
  }

  std::size_t num_layers() const { return sizes_.size() - 1; }
  std::size_t num_tensors() const { return 2 * num_layers(); }
  std::size_t in(std::size_t layer) const { return sizes_[layer]; }
  std::size_t out(std::size_t layer) const { return sizes_[layer + 1]; }
  std::size_t inputs() const { return sizes_.front(); }
  std::size_t classes() const { return sizes_.back(); }
  const std::vector<std::size_t>& sizes() const { return sizes_; }

  /// Elements of tensor t (weight or bias).
  std::size_t tensor_size(std::size_t t) const {
    const std::size_t l = t / 2;
    return t % 2 == 0 ? in(l)*out(l) : out(l);
  }
  /// The layer a tensor belongs to.
  static std::size_t layer_of(std::size_t t) { return t / 2; }
  /// "fc1.w", "fc1.b", "fc2.w", ... (1-based, as frameworks name them).
  static std::string tensor_name(std::size_t t) {
    return "fc" + std::to_string(t / 2 + 1) + (t % 2 == 0 ? ".w" : ".b");
  }

  /// Zero tensors of the right sizes (for gradients or pull buffers).
  tensors zeros() const {
    tensors t(num_tensors());
    for (std::size_t i = 0; i < t.size(); ++i) t[i].assign(tensor_size(i), 0.0f);
    return t;
  }

  /// He-uniform weights (right for ReLU), zero biases. Deterministic in `seed` on every
  /// platform: the uniform floats are made from mt19937's raw 32-bit output, never through
  /// std::uniform_real_distribution, whose algorithm the standard leaves to the library.
  tensors initial_params(std::uint32_t seed) const {
    tensors p = zeros();
    std::mt19937 gen(seed);
    for (std::size_t l = 0; l < num_layers(); ++l) {
      const float bound = std::sqrt(6.0f / static_cast<float>(in(l)));
      for (float& w : p[2 * l]) {
        const float u = static_cast<float>(gen() >> 8) * (1.0f / 16777216.0f);  // [0, 1)
        w = (2.0f * u - 1.0f) * bound;
      }
    }
    return p;
  }

  /// Per-thread scratch: activations, deltas, the transposed weight, and this thread's gradients.
  struct workspace {
    std::size_t capacity = 0;     // rows the buffers are sized for
    tensors act;                  // act[l] = output of layer l (after ReLU for hidden layers)
    std::vector<float> delta;     // gradient w.r.t. the current layer's output
    std::vector<float> delta_in;  // gradient w.r.t. its input
    std::vector<float> wt;        // a transposed weight
    tensors grads;                // sums over this thread's rows
  };

  workspace make_workspace(std::size_t max_rows) const {
    workspace ws;
    ws.capacity = max_rows;
    ws.act.resize(num_layers());
    std::size_t widest = 0;
    for (std::size_t l = 0; l < num_layers(); ++l) {
      ws.act[l].assign(max_rows * out(l), 0.0f);
      widest = std::max(widest, out(l));
    }
    // Every delta is rows x (some layer's output width); the input gradient of layer l >= 1 is
    // rows x out(l - 1). So both buffers need rows x the widest output, and can swap roles.
    std::size_t biggest_w = 1;
    for (std::size_t l = 1; l < num_layers(); ++l) biggest_w = std::max(biggest_w, in(l)*out(l));
    ws.delta.assign(max_rows * widest, 0.0f);
    ws.delta_in.assign(max_rows * widest, 0.0f);
    ws.wt.assign(biggest_w, 0.0f);
    ws.grads = zeros();
    return ws;
  }

  /// Forward pass of `rows` inputs (rows x inputs(), contiguous); logits end in ws.act.back().
  void forward(const tensors& params, const float* x, std::size_t rows, workspace& ws) const {
    check_rows(rows, ws);
    const float* input = x;
    for (std::size_t l = 0; l < num_layers(); ++l) {
      float* y = ws.act[l].data();
      kernel::gemm_nn(input, params[2 * l].data(), params[2 * l + 1].data(), y, rows, in(l),
                      out(l));
      if (l + 1 < num_layers()) {
        for (std::size_t i = 0; i < rows * out(l); ++i) y[i] = std::max(y[i], 0.0f);
      }
      input = y;
    }
  }

  /// Softmax cross-entropy of the logits in ws.act.back() against `labels`: returns the summed
  /// loss and leaves d(loss)/d(logits) = softmax - onehot in ws.delta.
  double softmax_xent(const std::uint8_t* labels, std::size_t rows, workspace& ws) const {
    const std::size_t c = classes();
    const float* z = ws.act.back().data();
    float* d = ws.delta.data();
    double loss = 0;
    for (std::size_t i = 0; i < rows; ++i) {
      const float* zi = z + i * c;
      float* di = d + i * c;
      const float mx = *std::max_element(zi, zi + c);
      float sum = 0;
      for (std::size_t j = 0; j < c; ++j) {
        di[j] = std::exp(zi[j] - mx);
        sum += di[j];
      }
      const float inv = 1.0f / sum;
      for (std::size_t j = 0; j < c; ++j) di[j] *= inv;
      const std::size_t y = labels[i];
      loss += std::log(sum) - (zi[y] - mx);
      di[y] -= 1.0f;
    }
    return loss;
  }

  /// Backward pass after forward() and softmax_xent(): fills ws.grads with gradients summed over
  /// the rows (the optimizer's rescale_grad turns sums into means). Layers are done last to first;
  /// `layer_done(l)` is called as soon as layer l's gradients are final, so a caller can send them
  /// while the earlier layers are still being computed.
  void backward(const tensors& params, const float* x, std::size_t rows, workspace& ws,
                const std::function<void(std::size_t)>& layer_done = {}) const {
    check_rows(rows, ws);
    for (std::size_t l = num_layers(); l-- > 0;) {
      const float* input = l == 0 ? x : ws.act[l - 1].data();
      const std::size_t ni = in(l);
      const std::size_t no = out(l);
      // Weight and bias gradients from delta (rows x no).
      kernel::gemm_tn(input, ws.delta.data(), ws.grads[2 * l].data(), rows, ni, no);
      float* gb = ws.grads[2 * l + 1].data();
      std::fill(gb, gb + no, 0.0f);
      for (std::size_t i = 0; i < rows; ++i) {
        const float* di = ws.delta.data() + i * no;
        for (std::size_t j = 0; j < no; ++j) gb[j] += di[j];
      }
      if (l > 0) {
        // delta for the layer below: (delta * W^T), masked by where its ReLU was active.
        kernel::transpose(params[2 * l].data(), ws.wt.data(), ni, no);
        kernel::gemm_nn(ws.delta.data(), ws.wt.data(), nullptr, ws.delta_in.data(), rows, no, ni);
        const float* a = ws.act[l - 1].data();
        float* dn = ws.delta_in.data();
        for (std::size_t i = 0; i < rows * ni; ++i) dn[i] = a[i] > 0.0f ? dn[i] : 0.0f;
        std::swap(ws.delta, ws.delta_in);
      }
      if (layer_done) layer_done(l);
    }
  }

  /// Number of rows whose largest logit is the label (after forward()).
  std::size_t correct(const std::uint8_t* labels, std::size_t rows, const workspace& ws) const {
    const std::size_t c = classes();
    const float* z = ws.act.back().data();
    std::size_t n = 0;
    for (std::size_t i = 0; i < rows; ++i) {
      const float* zi = z + i * c;
      n += static_cast<std::size_t>(std::max_element(zi, zi + c) - zi) == labels[i];
    }
    return n;
  }

 private:
  void check_rows(std::size_t rows, const workspace& ws) const {
    if (rows > ws.capacity) {
      throw std::invalid_argument("mlp: " + std::to_string(rows) +
                                  " rows but the workspace holds " + std::to_string(ws.capacity));
    }
  }

  std::vector<std::size_t> sizes_;
};

}  // namespace mnist
