// CUDA launchers of the optimizer steps (namespace fsdp::optim::cuda): one element-wise kernel
// per optimizer running the update_math.h formulas on the tensors' device, on the calling
// thread's current stream of that device (fsdp::CurrentCudaStream), not synchronised.
// Results are bit-identical to the CPU loops of sgd.cc / adam.cc, except that a NaN result may
// differ in sign/payload (the GPU writes its canonical NaN; IEEE leaves this unspecified).
//
// Called only from SGD::step / Adam::step after they validated the tensors: every tensor on
// the parameter's CUDA device, with the parameter's shape and (floating) dtype; the grad was
// already converted to the parameter's dtype. State tensors that an update does not use are
// undefined Tensors (momentum_buffer without momentum, max_exp_avg_sq without amsgrad). The
// launchers do not bump version counters (the caller does, for every tensor written).
//
// This header includes no CUDA headers; it is declared in every build and defined only in
// builds with CUDA (optim_cuda.cu). Call through FSDP_OPTIM_CUDA, which throws Unavailable in
// CPU-only builds without needing the definitions at link time.
// Thread-safety: stateless.
#pragma once

#include <string>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/optim/update_math.h"
#include "fsdp/config.h"

namespace fsdp::optim::cuda {

// Writes param and (with momentum) momentum_buffer.
void SgdStep(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
             const math::SgdStepSpec& spec);

// Writes param, exp_avg, exp_avg_sq and (with amsgrad) max_exp_avg_sq.
void AdamStep(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
              const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq,
              const math::AdamStepSpec& spec);

}  // namespace fsdp::optim::cuda

namespace fsdp::optim::internal {

template <typename T>
T OptimCudaUnavailable(const std::string& who, const std::string& label) {
  FSDP_THROW(ErrorCode::kUnavailable, who, ": parameter ", label,
             " is a CUDA tensor but this build has no CUDA kernels (configured without nvcc or "
             "with FSDP_ENABLE_CUDA=OFF)");
}

}  // namespace fsdp::optim::internal

// FSDP_OPTIM_CUDA(who, label, SgdStep(...)) calls fsdp::optim::cuda::SgdStep(...) in builds with
// CUDA; in CPU-only builds the call is only named in an unevaluated decltype (so nothing needs
// to be linked) and Unavailable is thrown.
#if FSDP_HAVE_CUDA
#define FSDP_OPTIM_CUDA(who, label, ...) ::fsdp::optim::cuda::__VA_ARGS__
#else
#define FSDP_OPTIM_CUDA(who, label, ...)                                                         \
  ::fsdp::optim::internal::OptimCudaUnavailable<decltype(::fsdp::optim::cuda::__VA_ARGS__)>(who, \
                                                                                            label)
#endif
