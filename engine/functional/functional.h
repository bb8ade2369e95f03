// The differentiable functional API (namespace fsdp): free functions with PyTorch's names and
// argument conventions. The namespace stays the top-level `fsdp`, as torch's ops live at
// top-level torch.* (fsdp::add, fsdp::linear, ...), although the files sit in engine/functional.
//
// Layering: engine/functional sits ABOVE both engine/autograd and the raw kernels of
// engine/ops (namespace fsdp::ops); kernels never include autograd or this API, and autograd
// never includes this API (scripts/check_layering.sh). Each function runs a raw kernel of engine/ops and, when grad
// mode is on and an input requires grad, attaches autograd history through
// autograd::record_function with a node named as PyTorch names it ("AddmmBackward0",
// "NativeLayerNormBackward0", ...), saving what backward needs as autograd::SavedTensor.
// Ownership: functions return new tensors (or aliases, see below); nothing is retained beyond
// the recorded graph.
//
// Graph shape follows PyTorch (see docs/autograd.md, "Graph shape of ops"): one node per ATen op,
// and the ops PyTorch decomposes are recorded as the same sequence of nodes, e.g.
//   linear(x 2-D, W, b)      -> TBackward0, AddmmBackward0
//   linear(x 2-D, W)         -> TBackward0, MmBackward0
//   linear(x N-D, W, b)      -> ViewBackward0, TBackward0, AddmmBackward0, ViewBackward0
//   linear(x N-D, W)         -> TBackward0, ViewBackward0, MmBackward0, UnsafeViewBackward0
//   matmul(a N-D, b N-D)     -> ExpandBackward0, ViewBackward0 (each operand), BmmBackward0,
//                               UnsafeViewBackward0
//   cross_entropy            -> LogSoftmaxBackward0, NllLossBackward0
//   rms_norm                 -> [ToCopyBackward0], PowBackward0, MeanBackward1, AddBackward0,
//                               RsqrtBackward0, MulBackward0, [ToCopyBackward0], MulBackward0
//   dropout (training, CPU)  -> MulBackward0 (input * scaled Bernoulli noise); on CUDA
//                               NativeDropoutBackward0; identity (no node) when p == 0 or eval
//   x + 2.0, x * 2.0, x / 2  -> AddBackward0, MulBackward0, DivBackward0 (scalars are wrapped
//                               numbers, as in Python); 2.0 - x -> RsubBackward1;
//                               2.0 / x -> ReciprocalBackward0, MulBackward0
// Inside linear, the weight transpose is an alias of the weight (no copy), so the saved mat2
// shares the weight's storage like PyTorch's w.t() view does.
//
// Tensors are contiguous: transpose/permute/t/narrow (on an inner dim) return copies;
// view/reshape/flatten/unsqueeze/squeeze and dim-0 narrow/select/split/chunk return aliases
// of the input's storage. dtype promotion follows torch.result_type; gradients come back in
// each input's dtype. Scalar arguments are doubles.
// Thread-safety: like PyTorch ops: call from the rank's own thread (autograd state is per
// thread); concurrent calls on distinct tensors are fine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace fsdp {

// ---- Elementwise arithmetic (broadcasting) -----------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // AddBackward0
Tensor add(const Tensor& a, double b);                             // AddBackward0
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // SubBackward0
Tensor sub(const Tensor& a, double b);                             // SubBackward0
Tensor rsub(const Tensor& a, double b);                            // b - a, RsubBackward1
Tensor mul(const Tensor& a, const Tensor& b);                      // MulBackward0
Tensor mul(const Tensor& a, double b);                             // MulBackward0
Tensor div(const Tensor& a, const Tensor& b);                      // DivBackward0
Tensor div(const Tensor& a, double b);                             // DivBackward0
Tensor neg(const Tensor& x);                                       // NegBackward0
Tensor exp(const Tensor& x);                                       // ExpBackward0
Tensor log(const Tensor& x);                                       // LogBackward0
Tensor sqrt(const Tensor& x);                                      // SqrtBackward0
Tensor rsqrt(const Tensor& x);                                     // RsqrtBackward0
Tensor reciprocal(const Tensor& x);                                // ReciprocalBackward0
Tensor pow(const Tensor& x, double exponent);                      // PowBackward0

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, double b);
Tensor operator-(double a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, double b);
Tensor operator/(double a, const Tensor& b);

// ---- Matrix products ---------------------------------------------------------------------------
Tensor t(const Tensor& x);                                            // TBackward0 (rank <= 2)
Tensor mm(const Tensor& a, const Tensor& b);                          // MmBackward0
Tensor bmm(const Tensor& a, const Tensor& b);                         // BmmBackward0 (3-D)
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b);   // AddmmBackward0
Tensor mv(const Tensor& a, const Tensor& v);                          // MvBackward0
Tensor dot(const Tensor& a, const Tensor& b);                         // DotBackward0
// torch.matmul, decomposed like ATen's _matmul_impl (see above).
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x Wᵀ + b with W [out, in], b [out] (optional), x [..., in].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- Activations -------------------------------------------------------------------------------
Tensor relu(const Tensor& x);                                               // ReluBackward0
Tensor gelu(const Tensor& x, const std::string& approximate = "none");      // GeluBackward0
Tensor softmax(const Tensor& x, int64_t dim);                               // SoftmaxBackward0
Tensor log_softmax(const Tensor& x, int64_t dim);                           // LogSoftmaxBackward0

// ---- Neural-network functions ------------------------------------------------------------------
// q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv]; attn_mask additive and broadcastable to
// [..., Sq, Sk]. Dropout applies whenever dropout_p > 0 (modules pass 0 in eval mode, as
// PyTorch's do), drawing from `generator` or the current rank's generator. One node:
// ScaledDotProductFlashAttentionForCpuBackward0 on CPU (ScaledDotProductEfficientAttentionBackward0
// on CUDA), with edges (q, k, v[, attn_mask]).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt,
                                    Generator* generator = nullptr);
// indices: int64 of any shape; weight [V, D]. EmbeddingBackward0 (edge: weight).
Tensor embedding(const Tensor& indices, const Tensor& weight,
                 std::optional<int64_t> padding_idx = std::nullopt);
// NativeLayerNormBackward0 (edges: input, weight, bias).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// Composite like ATen's rms_norm (see above); eps defaults to the op-math type's epsilon.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt);
// torch.nn.functional.batch_norm on [N, C] or [N, C, L]: NativeBatchNormBackward0 (edges:
// input, weight, bias). In training mode the running statistics (if given) are updated in
// place with `momentum` and the unbiased batch variance; `num_batches_tracked` (optional int64
// scalar, which nn.BatchNorm1d keeps) is incremented in place in training mode.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                  double momentum = 0.1, double eps = 1e-5, const Tensor& num_batches_tracked = Tensor());
// Returns x itself when p == 0 or !training.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Generator* generator = nullptr);

// ---- Reductions and losses ---------------------------------------------------------------------
Tensor sum(const Tensor& x);                                                          // SumBackward0
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);  // SumBackward1
Tensor mean(const Tensor& x);                                                         // MeanBackward0
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false); // MeanBackward1
// log_probs [N, C], target int64 [N]; reduction "mean" | "sum" | "none". NllLossBackward0.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const std::string& reduction = "mean",
                int64_t ignore_index = -100);
// log_softmax(logits, 1) then nll_loss.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction = "mean",
                     int64_t ignore_index = -100);

// ---- Shape operations --------------------------------------------------------------------------
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);     // TransposeBackward0
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims); // PermuteBackward0
Tensor view(const Tensor& x, const Shape& shape);                  // ViewBackward0 (one -1 allowed)
Tensor reshape(const Tensor& x, const Shape& shape);               // ViewBackward0
// torch.flatten: returns x itself when start_dim == end_dim on a tensor of rank >= 1.
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);  // ViewBackward0
Tensor unsqueeze(const Tensor& x, int64_t dim);                    // UnsqueezeBackward0
Tensor squeeze(const Tensor& x);                                   // SqueezeBackward0 (all size-1 dims)
Tensor squeeze(const Tensor& x, int64_t dim);                      // SqueezeBackward1
Tensor expand(const Tensor& x, const Shape& shape);                // ExpandBackward0 (-1 keeps a size)
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);  // SliceBackward0
Tensor select(const Tensor& x, int64_t dim, int64_t index);        // SelectBackward0
// torch.chunk / torch.split: one SplitBackward0 node with one output per piece.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// SplitWithSizesBackward0.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim = 0);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);   // CatBackward0
Tensor clone(const Tensor& x);                                     // CloneBackward0
// Differentiable cast (ToCopyBackward0); returns x itself when the dtype already matches.
Tensor to(const Tensor& x, DType dtype);

}  // namespace fsdp
