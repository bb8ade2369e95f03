// Shape-manipulation CPU kernels (namespace fsdp::ops::kernels). Tensors are contiguous, so
// permute/transpose/narrow along an inner dimension return materialised copies; views that
// keep contiguity (view, unsqueeze, narrow on dim 0, ...) are Tensor member functions.
// All dtypes are supported (these kernels move bytes, no arithmetic) except Cat's promotion.
// Thread-safety: stateless functions.
#pragma once

#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// out.sizes()[i] = x.sizes()[dims[i]] (dims a permutation; negative values allowed).
Tensor Permute(const Tensor& x, const std::vector<int64_t>& dims);
// The inverse permutation of `dims` (for PermuteBackward).
std::vector<int64_t> InversePermutation(const std::vector<int64_t>& dims);
Tensor Transpose(const Tensor& x, int64_t dim0, int64_t dim1);

// Concatenation along `dim`; dtypes promote (torch.cat). 1-D empty tensors are skipped, as in
// PyTorch's legacy behaviour.
Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim = 0);

// A copy of x[..., start:start+length, ...] along `dim`.
Tensor Narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
// A zero tensor of `input_shape` with `grad` written at [start, start + grad.size(dim)) along dim.
Tensor NarrowBackward(const Tensor& grad, const Shape& input_shape, int64_t dim, int64_t start);

// A copy of x converted to `dtype` (rounding to nearest even for float16/bfloat16 targets,
// truncation toward zero for int64); returns x itself when the dtype already matches.
Tensor Cast(const Tensor& x, DType dtype);

}  // namespace fsdp::ops::kernels
