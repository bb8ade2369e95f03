// The few tensor kernels the autograd engine itself needs: summing gradient contributions
// (input buffers, .grad accumulation, retain_grad), zeros/ones for materialised and implicit
// gradients, and sum_to for gradients of broadcast inputs. They are written here, not taken
// from engine/ops, so the engine has no dependency on the op library.
//
// CPU tensors are computed directly (float32, float64 and int64 natively; float16 and
// bfloat16 through float, rounding once per element like c10::Half arithmetic). Tensors on
// another device are staged through host memory: correct, not fast.
// Thread-safety: stateless.
#pragma once

#include "engine/core/tensor.h"

namespace fsdp::autograd::kernels {

// a + b as a new tensor with a's dtype and device (b is converted when its dtype differs).
// Shapes must match.
Tensor Add(const Tensor& a, const Tensor& b);
// a += b in place (a keeps its identity and storage; its version is bumped).
void AddInPlace(const Tensor& a, const Tensor& b);
// A new tensor equal to t (contiguous, same dtype and device).
Tensor Clone(const Tensor& t);
Tensor ZerosLike(const Shape& shape, DType dtype, Device device);
Tensor OnesLike(const Tensor& t);
// True when `shape` broadcasts to `target` (torch's is_expandable_to).
bool IsExpandableTo(const Shape& shape, const Shape& target);
// Sums `grad` (of a broadcast shape) down to `shape` (at::sum_to).
Tensor SumTo(const Tensor& grad, const Shape& shape);

}  // namespace fsdp::autograd::kernels
