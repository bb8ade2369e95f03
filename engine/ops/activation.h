// Activation CPU kernels (namespace fsdp::ops::kernels): relu, gelu (exact erf form, PyTorch's
// default approximate="none", and the "tanh" approximation), softmax and log_softmax over any
// dimension (numerically stable: the row maximum is subtracted), each with its backward.
// float16/bfloat16 compute in float32 and round the result once.
// Thread-safety: stateless functions.
#pragma once

#include <string>

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

Tensor Relu(const Tensor& x);
// grad where result > 0, else 0 (PyTorch's threshold_backward on the output).
Tensor ReluBackward(const Tensor& grad, const Tensor& result);

// `approximate` is "none" (x * Φ(x), with erf) or "tanh".
Tensor Gelu(const Tensor& x, const std::string& approximate = "none");
Tensor GeluBackward(const Tensor& grad, const Tensor& x, const std::string& approximate = "none");

Tensor Softmax(const Tensor& x, int64_t dim);
// result * (grad - sum(grad * result, dim)).
Tensor SoftmaxBackward(const Tensor& grad, const Tensor& result, int64_t dim);
Tensor LogSoftmax(const Tensor& x, int64_t dim);
// grad - exp(result) * sum(grad, dim).
Tensor LogSoftmaxBackward(const Tensor& grad, const Tensor& result, int64_t dim);

}  // namespace fsdp::ops::kernels
