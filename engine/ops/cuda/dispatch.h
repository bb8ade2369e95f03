// The CUDA dispatch point of the engine/ops kernels. Each kernel in engine/ops/*.cc starts
// (after validating its arguments) with
//
//   if (internal::OnCuda("relu", {&x})) return FSDP_CUDA_KERNEL("relu", Relu(x));
//
// OnCuda is true when an input lives on a CUDA device and then requires every input to live
// on that device (InvalidArgument naming both devices otherwise). FSDP_CUDA_KERNEL calls
// fsdp::ops::kernels::cuda::<call> in builds with CUDA; in CPU-only builds it throws
// Unavailable instead (the call is only named in an unevaluated decltype, so nothing needs
// to be linked).
// Thread-safety: stateless.
#pragma once

#include <initializer_list>

#include "engine/core/tensor.h"
#include "engine/ops/cuda/cuda_kernels.h"
#include "fsdp/config.h"

namespace fsdp::ops::kernels::internal {

// True when the kernel must run on CUDA. `allow_cpu_scalars`: 0-d CPU tensors may be combined
// with CUDA tensors (PyTorch's CPU-scalar rule for elementwise ops); the CUDA kernel copies
// them over.
inline bool OnCuda(const char* op, std::initializer_list<const Tensor*> inputs, bool allow_cpu_scalars = false) {
  // With allow_cpu_scalars, 0-d tensors do not choose the device unless every input is 0-d.
  bool any_dim = false;
  for (const Tensor* t : inputs) any_dim = any_dim || (t->defined() && t->dim() > 0);
  const Tensor* cuda = nullptr;
  for (const Tensor* t : inputs) {
    const bool primary = t->defined() && (!allow_cpu_scalars || !any_dim || t->dim() > 0);
    if (primary && t->device().is_cuda()) {
      cuda = t;
      break;
    }
  }
  if (cuda == nullptr) return false;
  const Device device = cuda->device();
  for (const Tensor* t : inputs) {
    if (!t->defined() || t->device() == device) continue;
    if (allow_cpu_scalars && t->dim() == 0 && t->device().is_cpu()) continue;
    FSDP_CHECK(false, op, ": expected all tensors to be on the same device, but found at least two devices, ",
               device.str(), " and ", t->device().str(), " (", cuda->str(), " and ", t->str(), ")");
  }
  return true;
}

template <typename T>
T CudaUnavailable(const char* op) {
  FSDP_THROW(ErrorCode::kUnavailable, op,
             ": the input is a CUDA tensor but this build has no CUDA kernels (configured without nvcc "
             "or with FSDP_ENABLE_CUDA=OFF)");
}

}  // namespace fsdp::ops::kernels::internal

#if FSDP_HAVE_CUDA
#define FSDP_CUDA_KERNEL(op, ...) ::fsdp::ops::kernels::cuda::__VA_ARGS__
#else
#define FSDP_CUDA_KERNEL(op, ...) \
  ::fsdp::ops::kernels::internal::CudaUnavailable<decltype(::fsdp::ops::kernels::cuda::__VA_ARGS__)>(op)
#endif
