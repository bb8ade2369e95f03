// Reduction CPU kernels (namespace fsdp::ops::kernels): sum and mean over all elements or over
// a list of dimensions (keepdim as in PyTorch), with their backward (broadcast the gradient back
// to the input shape). float16/bfloat16 accumulate in float32; int64 sums stay int64.
// Thread-safety: stateless functions.
#pragma once

#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// Sum of all elements: a 0-d tensor of x's dtype.
Tensor Sum(const Tensor& x);
// Sum over `dims` (negative dims allowed, duplicates rejected; an empty list reduces every
// dimension, like torch.sum(x, dim=[])).
Tensor Sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Mean of all elements / over `dims` (floating-point inputs only).
Tensor Mean(const Tensor& x);
Tensor Mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

// The output shape of a reduction of `shape` over `dims`.
Shape ReducedShape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim, const char* op);

// Gradient of Sum: `grad` (the reduced shape) broadcast back to `input_shape`.
Tensor SumBackward(const Tensor& grad, const Shape& input_shape, const std::vector<int64_t>& dims,
                   bool keepdim);
// Gradient of Mean: SumBackward divided by the number of reduced elements.
Tensor MeanBackward(const Tensor& grad, const Shape& input_shape, const std::vector<int64_t>& dims,
                    bool keepdim);
// Gradients of the all-element reductions.
Tensor SumBackward(const Tensor& grad, const Shape& input_shape);
Tensor MeanBackward(const Tensor& grad, const Shape& input_shape);

}  // namespace fsdp::ops::kernels
