// CUDA implementations of the engine/ops kernels (namespace fsdp::ops::kernels::cuda).
//
// These are called only from the dispatch line at the top of the matching CPU kernel in
// engine/ops/*.cc, after the CPU kernel has validated its arguments (shapes, dtypes, index
// ranges) and checked that every input lives on the same CUDA device (internal::OnCuda in
// dispatch.h). They therefore assume valid input and only add checks the CPU side cannot make.
// Results match the CPU kernels: same output dtype, shape and device, float16/bfloat16
// computed in float32 and rounded once; floating-point sums may associate differently (so
// results agree within rounding), while copies, casts, gathers, dropout masks and the
// embedding backward are bit-for-bit equal. Work is issued on the current stream of the
// inputs' device (engine/core/cuda_stream.h) and not synchronised, except where a result
// is read on the host.
//
// This header includes no CUDA headers; it is declared in every build, defined only when
// the project is built with CUDA (the *_cuda.cu / *_cuda.cc files next to it).
// Thread-safety: stateless, except that a Generator passed in is advanced.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention.h"
#include "engine/ops/dropout.h"
#include "engine/ops/loss.h"
#include "engine/ops/normalization.h"

namespace fsdp::ops::kernels::cuda {

// ---- Elementwise (elementwise_cuda.cu) ----------------------------------------------------------

// out = f(a, b) with broadcasting; `s` is the op's scalar (alpha, exponent).
enum class BinaryOp : uint8_t {
  kAdd,                  // a + s * b
  kSub,                  // a - s * b
  kMul,                  // a * b
  kDiv,                  // a / b
  kPowBackward,          // a * (s * b^(s - 1))      (a = grad, b = x)
  kSqrtBackward,         // a / (2 * b)              (b = result)
  kRsqrtBackward,        // -0.5 * a * b^3
  kReciprocalBackward,   // -a * b^2
  kRelu,                 // relu(a)                  (b ignored)
  kReluBackward,         // b > 0 ? a : 0            (b = result)
  kGelu,                 // gelu(a), erf form
  kGeluTanh,             // gelu(a), tanh approximation
  kGeluBackward,         // a * gelu'(b)             (b = x)
  kGeluTanhBackward,
};
// a and b on one CUDA device (0-d CPU operands are copied over); computes in
// ComputeDType(out_dtype) and writes out_dtype.
Tensor Binary(const char* op, BinaryOp code, double s, const Tensor& a, const Tensor& b, DType out_dtype);

enum class UnaryOp : uint8_t {
  kNeg, kExp, kLog, kSqrt, kRsqrt, kReciprocal,
  kAddScalar, kMulScalar, kDivScalar, kRSubScalar,  // x + s, x * s, x / s, s - x
  kPow,                                            // x^s
};
Tensor Unary(const char* op, UnaryOp code, double s, const Tensor& x, DType out_dtype);

// A contiguous copy of x broadcast to `shape` (validated by the caller).
Tensor Expand(const Tensor& x, const Shape& shape);
// x.permute(dims) materialised (dims wrapped and validated).
Tensor Permute(const Tensor& x, const std::vector<int64_t>& dims);
// x converted to `dtype` exactly like ConvertElements (bit-for-bit).
Tensor Cast(const Tensor& x, DType dtype);

// ---- Reductions (reduction_cuda.cu) -------------------------------------------------------------

// Sum of x over the sorted, wrapped `dims` (keepdim shape), accumulated in ComputeDType and
// written as `out_dtype`.
Tensor SumDims(const Tensor& x, const std::vector<int64_t>& dims, DType out_dtype);
// kernels::Mean over sorted, wrapped dims, result viewed as `out_shape`.
Tensor Mean(const Tensor& x, const std::vector<int64_t>& dims, const Shape& out_shape);
// kernels::SumToShape (the caller checked that shape broadcasts to grad's shape).
Tensor SumToShape(const Tensor& grad, const Shape& shape);

// ---- Shape ops (shape_cuda.cc) ------------------------------------------------------------------

Tensor Narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor NarrowBackward(const Tensor& grad, const Shape& input_shape, int64_t dim, int64_t start);
// Concatenation of `parts` (non-empty, validated) along dim into a tensor of `dtype`.
Tensor Cat(const std::vector<Tensor>& parts, int64_t dim, DType dtype);

// ---- Activations (activation_cuda.cu) -----------------------------------------------------------

Tensor Softmax(const Tensor& x, int64_t dim, bool log);
Tensor SoftmaxBackward(const Tensor& grad, const Tensor& result, int64_t dim, bool log);

// ---- Matrix products (linalg_cuda.cc, cuBLAS) ---------------------------------------------------

Tensor Mm(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, DType dtype);
Tensor Bmm(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, DType dtype);
Tensor Addmm(const Tensor& bias, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
             DType dtype);
Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType dtype);

// ---- Embedding (embedding_cuda.cu) --------------------------------------------------------------

// `host_indices` are the validated indices already read back by the caller.
Tensor Embedding(const Tensor& indices, const Tensor& weight);
Tensor EmbeddingBackward(const Tensor& grad, const std::vector<int64_t>& host_indices, int64_t num_weights,
                         std::optional<int64_t> padding_idx);

// ---- Loss (loss_cuda.cu) ------------------------------------------------------------------------

// `valid` is the number of targets that are not ignore_index (the mean's divisor).
Tensor NllLoss(const Tensor& log_probs, const Tensor& target, Reduction reduction, int64_t ignore_index,
               int64_t valid);
Tensor NllLossBackward(const Tensor& grad, const Tensor& log_probs, const Tensor& target,
                       Reduction reduction, int64_t ignore_index, int64_t valid);

// ---- Normalisation (normalization_cuda.cu) ------------------------------------------------------

// x seen as [rows, cols]; statistics have `stat_shape`.
LayerNormResult LayerNorm(const Tensor& x, int64_t rows, int64_t cols, const Shape& stat_shape,
                          const Tensor& weight, const Tensor& bias, double eps);
NormGrads LayerNormBackward(const Tensor& grad, const Tensor& x, int64_t rows, int64_t cols,
                            const Shape& normalized_shape, const Tensor& mean, const Tensor& rstd,
                            const Tensor& weight, bool need_input, bool need_weight, bool need_bias);
RmsNormResult RmsNorm(const Tensor& x, int64_t rows, int64_t cols, const Shape& stat_shape,
                      const Tensor& weight, double eps);
NormGrads RmsNormBackward(const Tensor& grad, const Tensor& x, int64_t rows, int64_t cols,
                          const Shape& normalized_shape, const Tensor& rstd, const Tensor& weight,
                          bool need_input, bool need_weight);
// x is [n, c, l]; `factor` is the running-statistics momentum already resolved by the caller.
BatchNormResult BatchNorm(const Tensor& x, int64_t n, int64_t c, int64_t l, const Tensor& weight,
                          const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                          bool training, double factor, double eps);
NormGrads BatchNormBackward(const Tensor& grad, const Tensor& x, int64_t n, int64_t c, int64_t l,
                            const Tensor& weight, const Tensor& save_mean, const Tensor& save_invstd,
                            bool training, bool need_input, bool need_weight, bool need_bias);

// ---- Dropout (dropout_cuda.cu) ------------------------------------------------------------------

// kernels::DropoutMask generated on `device`: the same mask, bit for bit, from the same
// generator state, which advances identically.
Tensor DropoutMask(const Shape& shape, double p, DType dtype, Device device, Generator& generator);
DropoutResult Dropout(const Tensor& x, double p, Generator& generator);

// ---- Attention (attention_cuda.cu) --------------------------------------------------------------

AttentionResult ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& attn_mask, double dropout_p, bool is_causal,
                                          double scale, Generator* generator);
AttentionGrads ScaledDotProductAttentionBackward(const Tensor& grad, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& attn,
                                                 const Tensor& dropout_mask, double scale, bool need_q,
                                                 bool need_k, bool need_v, bool need_mask,
                                                 const Shape& mask_shape, DType mask_dtype);

}  // namespace fsdp::ops::kernels::cuda
