// Forward and hand-derived backward of the layers the test models are built from, written as
// stateless functions on Eigen row-major matrices (one row per token / sample). Every backward
// recomputes what it needs from the forward inputs; nothing is taped or cached.
//
// PyTorch conventions reproduced exactly:
//   * Linear: y = x Wᵀ + b, weight [out, in].
//   * LayerNorm: biased variance over the last dim, eps 1e-5 by default, optional weight/bias.
//   * RMSNormPython: x * rsqrt(mean(x², -1) + eps) * weight, eps 1e-6 by default.
//   * BatchNorm1d: input [N, C] or [N, C, L]; training normalises with the biased batch variance
//   and
//     updates running_var with the unbiased one (momentum 0.1); eval uses the running statistics.
//   * GELU is the exact erf form; ReLU's derivative at 0 is 0.
//   * Scaled-dot-product attention: softmax(q kᵀ · scale) v, scale 1/sqrt(head_dim) by default,
//     is_causal keeps key j for query i iff j <= i (top-left aligned, as torch's tril mask).
//
// Thread-safety: pure functions. Ownership: results are returned by value.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <vector>

#include "reference/tensor.h"

namespace fsdp::reference {

template <typename T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

// ---- Tensor <-> Eigen --------------------------------------------------------------------------

// The tensor viewed as [numel / cols, cols] (cols = last dim), copied. A 1-d tensor becomes one
// row. Throws on a 0-d tensor.
template <typename T>
Matrix<T> ToMatrix(const BasicRefTensor<T>& t);
// The tensor as a vector (any shape, row-major order).
template <typename T>
Vector<T> ToVector(const BasicRefTensor<T>& t);
// Matrix/vector values with the given shape (numel must match).
template <typename T>
BasicRefTensor<T> FromMatrix(const Matrix<T>& m, const Shape& shape);
template <typename T>
BasicRefTensor<T> FromVector(const Vector<T>& v, const Shape& shape);

// ---- Linear ------------------------------------------------------------------------------------

// x [n, in], weight [out, in], bias [out] or null. Returns [n, out].
template <typename T>
Matrix<T> LinearForward(const Matrix<T>& x, const Matrix<T>& weight, const Vector<T>* bias);

template <typename T>
struct LinearGrads {
  Matrix<T> input;   // [n, in]
  Matrix<T> weight;  // [out, in]
  Vector<T> bias;    // [out]; empty when the layer has no bias
};
template <typename T>
LinearGrads<T> LinearBackward(const Matrix<T>& x, const Matrix<T>& weight, bool has_bias,
                              const Matrix<T>& grad_out);

// ---- Embedding ---------------------------------------------------------------------------------

// Rows of `table` [num_embeddings, dim] selected by `ids` (each in [0, num_embeddings)).
template <typename T>
Matrix<T> EmbeddingForward(const Matrix<T>& table, const std::vector<int64_t>& ids);
// Gradient of the table: grad_out row i is added to row ids[i] (repeated ids accumulate).
template <typename T>
Matrix<T> EmbeddingBackward(int64_t num_embeddings, const std::vector<int64_t>& ids,
                            const Matrix<T>& grad_out);

// ---- Normalisations (over the last dim, one row at a time) ------------------------------------

template <typename T>
struct NormGrads {
  Matrix<T> input;
  Vector<T> weight;  // empty without weight
  Vector<T> bias;    // empty without bias
};

// LayerNorm over each row. weight/bias may be null (elementwise_affine=False, bias=False).
template <typename T>
Matrix<T> LayerNormForward(const Matrix<T>& x, const Vector<T>* weight, const Vector<T>* bias,
                           double eps = 1e-5);
template <typename T>
NormGrads<T> LayerNormBackward(const Matrix<T>& x, const Vector<T>* weight, bool has_bias,
                               const Matrix<T>& grad_out, double eps = 1e-5);

// RMSNormPython: x * rsqrt(mean(x², -1, keepdim) + eps) * weight.
template <typename T>
Matrix<T> RmsNormForward(const Matrix<T>& x, const Vector<T>& weight, double eps = 1e-6);
template <typename T>
NormGrads<T> RmsNormBackward(const Matrix<T>& x, const Vector<T>& weight, const Matrix<T>& grad_out,
                             double eps = 1e-6);

// ---- BatchNorm1d -------------------------------------------------------------------------------

// Running statistics of one BatchNorm1d (its buffers running_mean, running_var,
// num_batches_tracked). PyTorch's defaults are zeros, ones and 0.
template <typename T>
struct BatchNormStats {
  Vector<T> running_mean;
  Vector<T> running_var;
  int64_t num_batches_tracked = 0;
};

struct BatchNormOptions {
  double eps = 1e-5;      // Default: 1e-5.
  double momentum = 0.1;  // Default: 0.1 (the cumulative-average mode, momentum=None, is absent).
  bool training = true;   // Default: true (batch statistics; running stats updated).
};

// x is [N, C] or [N, C, L]; statistics are per channel over N (and L). In training `stats` is
// updated in place (may be null to skip the update); in eval it is read (must not be null).
// Throws std::invalid_argument when training with one value per channel, as torch does.
template <typename T>
BasicRefTensor<T> BatchNormForward(const BasicRefTensor<T>& x, const Vector<T>* weight,
                                   const Vector<T>* bias, BatchNormStats<T>* stats,
                                   const BatchNormOptions& options);

template <typename T>
struct BatchNormGrads {
  BasicRefTensor<T> input;
  Vector<T> weight;  // empty without weight
  Vector<T> bias;    // empty without bias
};
// `stats` is only read in eval mode (the statistics the forward normalised with).
template <typename T>
BatchNormGrads<T> BatchNormBackward(const BasicRefTensor<T>& x, const Vector<T>* weight,
                                    bool has_bias, const BatchNormStats<T>* stats,
                                    const BatchNormOptions& options,
                                    const BasicRefTensor<T>& grad_out);

// ---- Activations (elementwise) -----------------------------------------------------------------

template <typename T>
Matrix<T> ReluForward(const Matrix<T>& x);
// grad_out where x > 0, else 0.
template <typename T>
Matrix<T> ReluBackward(const Matrix<T>& x, const Matrix<T>& grad_out);

// Exact GELU: 0.5 x (1 + erf(x / sqrt(2))).
template <typename T>
Matrix<T> GeluForward(const Matrix<T>& x);
template <typename T>
Matrix<T> GeluBackward(const Matrix<T>& x, const Matrix<T>& grad_out);

// ---- Attention ---------------------------------------------------------------------------------

// Row-wise softmax. With `causal`, entry (i, j) for j > i is excluded (probability 0).
template <typename T>
Matrix<T> SoftmaxRows(const Matrix<T>& scores, bool causal = false);

// Single-head attention: q [Lq, d], k [Lk, d], v [Lk, dv] -> [Lq, dv].
template <typename T>
Matrix<T> AttentionForward(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v, bool causal,
                           double scale);

template <typename T>
struct AttentionGrads {
  Matrix<T> q, k, v;
};
template <typename T>
AttentionGrads<T> AttentionBackward(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v,
                                    bool causal, double scale, const Matrix<T>& grad_out);

// Where the rows of a batch of sequences live in a [batch * seq, features] matrix.
enum class SequenceLayout {
  kBatchFirst,     // row = b * seq_len + s   (tensors [B, S, E], e.g. the DTensor Transformer)
  kSequenceFirst,  // row = s * batch + b     (tensors [S, B, E], e.g. nn.Transformer default)
};

// Multi-head attention on already projected q [B*Lq, E], k [B*Lk, E], v [B*Lk, E]: head h uses
// columns [h*E/H, (h+1)*E/H); scale 1/sqrt(E/H). Returns the concatenated heads [B*Lq, E]
// (before any output projection).
template <typename T>
Matrix<T> MultiHeadAttentionForward(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v,
                                    int64_t batch, int64_t num_heads, SequenceLayout layout,
                                    bool causal);
template <typename T>
AttentionGrads<T> MultiHeadAttentionBackward(const Matrix<T>& q, const Matrix<T>& k,
                                             const Matrix<T>& v, int64_t batch, int64_t num_heads,
                                             SequenceLayout layout, bool causal,
                                             const Matrix<T>& grad_out);

}  // namespace fsdp::reference
