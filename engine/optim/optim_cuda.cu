// CUDA kernels of the optimizer steps (optim_cuda.h): one grid-stride element-wise kernel per
// optimizer, templated only on the accumulation type (float for float32/float16/bfloat16,
// double for float64); the storage dtype is a runtime switch (the ElemType loads/stores of
// numerics.h and math::ElemRounding), as in the engine/ops kernels. The loop bodies are
// math::SgdStepAt / math::AdamStepAt (update_math.h), also run by the host tests.
//
// [Note: no FMA contraction] The per-element formulas (update_math.h) are shared with the CPU
// loops, which g++ compiles without contraction (x86-64, -std=c++20). nvcc contracts a*b+c into
// one FMA by default (-fmad=true), which rounds once instead of twice and would make device
// results differ from the CPU in the last bit. This file is therefore compiled with
// -fmad=false (engine/CMakeLists.txt), which turns every + and * of device code into a
// separately rounded add.rn/mul.rn; division and sqrt stay IEEE-rounded (-prec-div=true,
// -prec-sqrt=true, -ftz=false, set explicitly there as well). We chose the compile flag over
// __fmul_rn/__fadd_rn intrinsics so the formulas stay one readable expression per op, shared
// verbatim by host and device; the flag covers the whole file, and only this file instantiates
// the update math for the device.
#include <cuda_runtime.h>

#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/optim/optim_cuda.h"
#include "engine/optim/update_math.h"

namespace fsdp::optim::cuda {

namespace {

using ops::kernels::cuda::CheckLaunch;
using ops::kernels::cuda::DeviceGuard;
using ops::kernels::cuda::Elem;
using ops::kernels::cuda::ElemType;
using ops::kernels::cuda::GridFor;
using ops::kernels::cuda::LaunchConfig;
using ops::kernels::cuda::StreamOf;

// `buf` is null without momentum.
template <typename A>
__global__ void SgdKernel(math::SgdScalars<A> s, void* param, const void* grad, void* buf,
                          ElemType t, int64_t n) {
  FSDP_GRID_STRIDE_LOOP(i, n) { math::SgdStepAt(s, param, grad, buf, t, i); }
}

// `vmax` is null without amsgrad.
template <typename A>
__global__ void AdamKernel(math::AdamScalars<A> s, void* param, const void* grad, void* m, void* v,
                           void* vmax, ElemType t, int64_t n) {
  FSDP_GRID_STRIDE_LOOP(i, n) { math::AdamStepAt(s, param, grad, m, v, vmax, t, i); }
}

// The launchers' own invariants (the optimizers validated devices, shapes and dtypes).
void CheckOperand(const char* who, const Tensor& param, const Tensor& t, const char* what) {
  FSDP_INTERNAL_ASSERT(
      t.device() == param.device() && t.dtype() == param.dtype() && t.numel() == param.numel(), who,
      ": ", what, " ", t.str(), " does not match the parameter ", param.str());
}

void* DataOrNull(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// Calls launch(A{}, config, stream) with the accumulation type A of `param` (OpMath of its
// storage type, engine/core/dtype.h: double for float64, float otherwise) on its device's
// current stream, then checks the launch.
template <typename Launch>
void LaunchOver(const Tensor& param, const char* what, Launch&& launch) {
  const int64_t n = param.numel();
  if (n == 0) return;
  DeviceGuard guard(param.device());
  const LaunchConfig c = GridFor(n);
  cudaStream_t stream = StreamOf(param.device());
  if (OpMathDType(param.dtype()) == DType::kFloat64) {
    launch(double{}, c, stream);
  } else {
    launch(float{}, c, stream);
  }
  CheckLaunch(what);
}

}  // namespace

void SgdStep(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
             const math::SgdStepSpec& spec) {
  FSDP_INTERNAL_ASSERT(param.device().is_cuda() && IsFloatingPoint(param.dtype()),
                       "SgdStep: expected a floating CUDA parameter, got ", param.str());
  CheckOperand("SgdStep", param, grad, "grad");
  if (momentum_buffer.defined()) CheckOperand("SgdStep", param, momentum_buffer, "momentum_buffer");
  const ElemType t = Elem(param.dtype());
  const int64_t n = param.numel();
  void* buf = DataOrNull(momentum_buffer);
  LaunchOver(param, "SGD step kernel", [&](auto tag, const LaunchConfig& c, cudaStream_t stream) {
    using A = decltype(tag);
    SgdKernel<A><<<c.blocks, c.threads, 0, stream>>>(math::MakeSgdScalars<A>(spec),
                                                     param.data_ptr(), grad.data_ptr(), buf, t, n);
  });
}

void AdamStep(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
              const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq,
              const math::AdamStepSpec& spec) {
  FSDP_INTERNAL_ASSERT(param.device().is_cuda() && IsFloatingPoint(param.dtype()),
                       "AdamStep: expected a floating CUDA parameter, got ", param.str());
  CheckOperand("AdamStep", param, grad, "grad");
  CheckOperand("AdamStep", param, exp_avg, "exp_avg");
  CheckOperand("AdamStep", param, exp_avg_sq, "exp_avg_sq");
  FSDP_INTERNAL_ASSERT(max_exp_avg_sq.defined() == spec.amsgrad,
                       "AdamStep: max_exp_avg_sq must be given exactly when amsgrad is set");
  if (max_exp_avg_sq.defined()) CheckOperand("AdamStep", param, max_exp_avg_sq, "max_exp_avg_sq");
  const ElemType t = Elem(param.dtype());
  const int64_t n = param.numel();
  void* vmax = DataOrNull(max_exp_avg_sq);
  LaunchOver(param, "Adam step kernel", [&](auto tag, const LaunchConfig& c, cudaStream_t stream) {
    using A = decltype(tag);
    AdamKernel<A><<<c.blocks, c.threads, 0, stream>>>(
        math::MakeAdamScalars<A>(spec), param.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(),
        exp_avg_sq.data_ptr(), vmax, t, n);
  });
}

}  // namespace fsdp::optim::cuda
