// Broadcasting and type promotion for the CPU kernels (namespace fsdp::ops::kernels).
//
// Shapes broadcast like NumPy/PyTorch: aligned from the trailing dimension, a size-1 or missing
// dimension stretches. Dtypes promote like torch.result_type for the five supported dtypes.
// Thread-safety: stateless functions.
#pragma once

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// The broadcast of two shapes; throws InvalidArgument naming `op` and both shapes when they
// are not broadcastable.
Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op = "broadcast");

// torch.promote_types: int64 < float16, bfloat16 < float32 < float64, and float16 with
// bfloat16 gives float32.
DType PromoteTypes(DType a, DType b);

// torch.result_type of two tensors: like PromoteTypes, except that a 0-d tensor does not raise
// the dtype of a dimensioned tensor of the same category (floating point or integral).
DType ResultType(const Tensor& a, const Tensor& b);

// torch.result_type(tensor, python float): the tensor's dtype when it is floating point,
// float32 (the default dtype) for an int64 tensor and a non-integral scalar, else int64.
DType ResultTypeWithScalar(const Tensor& t, double scalar);

// A materialised (contiguous) copy of `x` broadcast to `shape`. Returns `x` itself when the
// shapes are equal.
Tensor Expand(const Tensor& x, const Shape& shape);

// Sums `grad` over the dimensions along which a tensor of `shape` was broadcast to
// grad.sizes() (torch's sum_to_size). Returns `grad` itself when the shapes are equal.
Tensor SumToShape(const Tensor& grad, const Shape& shape);

}  // namespace fsdp::ops::kernels
