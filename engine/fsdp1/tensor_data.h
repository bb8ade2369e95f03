// PyTorch's `tensor.data = other` and `param.grad.data = grad` for FSDP1, which rebinds the
// data of its flat parameter, of the original parameters and of gradients without changing the
// tensors' identity (docs/fsdp1.md, "Flat parameter layout"). Stateless; thread-safety: as the
// tensors passed.
#pragma once

#include "engine/core/tensor.h"

namespace fsdp::fsdp1 {

// `tensor.data = src`: `tensor` now views `src`'s storage (offset, sizes, dtype); its autograd
// meta (grad, AccumulateGrad, hooks) is kept. The version counter is not bumped.
void SetData(const Tensor& tensor, const Tensor& src);

// `tensor.grad = grad` without Tensor::set_grad's size/dtype/device checks: a flat
// parameter's unsharded gradient outlives its unsharded data, and an original parameter's
// sharded data has another shape than its unsharded gradient view. An undefined grad clears.
void SetGradUnchecked(const Tensor& tensor, const Tensor& grad);

}  // namespace fsdp::fsdp1
