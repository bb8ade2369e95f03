// Internal helpers of the functional API's implementation files (engine/functional/*.cc; not
// part of the public API). Ownership: value helpers, nothing retained. Thread-safety: stateless functions; grad mode is per thread.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/autograd/record.h"
#include "engine/core/tensor.h"

namespace fsdp::functional_internal {

using autograd::SavedTensor;
using autograd::TensorList;

inline bool RequiresGrad(const Tensor& t) { return t.defined() && t.requires_grad(); }

// Whether record_function would record a node for these inputs: grad mode on and at least one
// input requires grad. Ops check it before building SavedTensors, so saved-tensor hooks only
// see tensors that a node really saves (as in PyTorch).
inline bool ShouldRecord(std::initializer_list<const Tensor*> inputs) {
  if (!autograd::GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs) {
    if (RequiresGrad(*t)) return true;
  }
  return false;
}
inline bool ShouldRecord(const std::vector<Tensor>& inputs) {
  if (!autograd::GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (RequiresGrad(t)) return true;
  }
  return false;
}

// `g` converted to the dtype of `like` (gradients must match their input's dtype).
inline Tensor AsDTypeOf(const Tensor& g, DType dtype) { return g.defined() ? g.to(dtype) : g; }

// The node name of an op whose name depends on the device, like PyTorch's dispatch.
inline std::string DeviceName(const Tensor& t, const char* cpu, const char* cuda) {
  return t.device().is_cuda() ? cuda : cpu;
}

}  // namespace fsdp::functional_internal

namespace fsdp::functional_internal {

// at::_unsafe_view: a reshape recorded as UnsafeViewBackward0 (used by matmul/linear).
Tensor unsafe_view(const Tensor& x, const Shape& shape);

}  // namespace fsdp::functional_internal
