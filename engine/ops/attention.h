// Scaled-dot-product attention CPU kernels (namespace fsdp::ops::kernels), the math of
// torch.nn.functional.scaled_dot_product_attention:
//   S = q kᵀ * scale (+ attn_mask; causal: keys after the query position masked with -inf,
//   top-left aligned like tril(ones(Sq, Sk))), P = softmax(S, -1), O = dropout(P) v.
// q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv] with identical leading dims (e.g. [B, H]);
// scale defaults to 1 / sqrt(D). A fully masked row yields zeros. float16/bfloat16 compute in
// float32. Dropout (dropout_p > 0) draws its mask with DropoutMask from `generator`.
// Thread-safety: stateless, except that the generator is advanced when dropout_p > 0.
#pragma once

#include <optional>

#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// Output and saved state of ScaledDotProductAttention (value type).
struct AttentionResult {
  Tensor output;        // [..., Sq, Dv], q's dtype
  Tensor attn;          // P = softmax(S) before dropout, [..., Sq, Sk], compute dtype
  Tensor dropout_mask;  // [..., Sq, Sk] compute dtype (0 or 1/(1-p)); undefined without dropout
  double scale = 0.0;   // the scale used
};
// attn_mask (optional) is an additive floating-point mask broadcastable to [..., Sq, Sk]; it
// must not be given together with is_causal. `generator` is required when dropout_p > 0.
AttentionResult ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                          bool is_causal = false, std::optional<double> scale = std::nullopt,
                                          Generator* generator = nullptr);

// Gradients of ScaledDotProductAttention (value type; undefined when not requested).
struct AttentionGrads {
  Tensor q;
  Tensor k;
  Tensor v;
  Tensor attn_mask;  // reduced to `mask_shape`; undefined unless need_mask
};
AttentionGrads ScaledDotProductAttentionBackward(const Tensor& grad, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& attn,
                                                 const Tensor& dropout_mask, double scale,
                                                 bool need_q = true, bool need_k = true, bool need_v = true,
                                                 bool need_mask = false, const Shape& mask_shape = Shape(),
                                                 DType mask_dtype = DType::kFloat32);

}  // namespace fsdp::ops::kernels
