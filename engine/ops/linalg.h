// Matrix-product CPU kernels (namespace fsdp::ops::kernels) on Eigen: mm, batched mm, addmm,
// numpy-style matmul for operands of rank >= 2, and linear (y = x Wᵀ + b, nn.Linear's layout),
// with their backward. Transposed operands are flags, so backward never materialises a
// transpose. float16/bfloat16 multiply in float32 and round the result once.
// Thread-safety: stateless functions.
#pragma once

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// op(a) @ op(b) for 2-D a, b, where op transposes when the flag is set:
// a is [M, K] ([K, M] transposed), b is [K, N] ([N, K] transposed); the result is [M, N].
Tensor Mm(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

// Batched Mm over identical leading dimensions: a [..., M, K], b [..., K, N] -> [..., M, N]
// (flags transpose the last two dims of an operand). Both operands need the same rank >= 3
// and equal leading dims (no broadcasting; see Matmul).
Tensor Bmm(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

// bias + op(a) @ op(b), bias broadcastable to [M, N] (torch.addmm with beta = alpha = 1).
Tensor Addmm(const Tensor& bias, const Tensor& a, const Tensor& b, bool transpose_a = false,
             bool transpose_b = false);

// torch.matmul for operands of rank >= 2: batch dimensions broadcast.
Tensor Matmul(const Tensor& a, const Tensor& b);

// x [..., in] @ weightᵀ ([out, in]) + bias ([out], optional) -> [..., out].
Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// Gradients of a matrix product (value type; a gradient is undefined when not requested).
struct MatmulGrads {
  Tensor a;
  Tensor b;
};
// Gradients of Mm / Bmm (without transposes): grad @ bᵀ and aᵀ @ grad.
MatmulGrads MmBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a = true,
                       bool need_b = true);
MatmulGrads BmmBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a = true,
                        bool need_b = true);
// Gradients of Matmul (rank >= 2), summed over broadcast batch dimensions.
MatmulGrads MatmulBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a = true,
                           bool need_b = true);

// Gradients of Linear (value type; a gradient is undefined when not requested).
struct LinearGrads {
  Tensor input;
  Tensor weight;
  Tensor bias;
};
// Gradients of Linear; `need_bias` is ignored when `has_bias` is false.
LinearGrads LinearBackward(const Tensor& grad, const Tensor& x, const Tensor& weight, bool has_bias,
                           bool need_input = true, bool need_weight = true, bool need_bias = true);

}  // namespace fsdp::ops::kernels
