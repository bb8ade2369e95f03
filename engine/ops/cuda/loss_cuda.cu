// CUDA nll_loss and its backward on [N, C] log-probabilities with int64 targets (targets were
// validated on the host by the CPU kernel). Cross-entropy composes log_softmax and these.
#include <cuda_runtime.h>

#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

// per_row[i] = -x[i, t_i] (0 for ignored targets), in the compute dtype.
template <typename T>
__global__ void NllRowsKernel(const void* x, ElemType tx, const int64_t* target, void* per_row, int64_t n, int64_t c,
                              int64_t ignore_index) {
  FSDP_GRID_STRIDE_LOOP(i, n) {
    const int64_t t = target[i];
    static_cast<T*>(per_row)[i] = t == ignore_index ? T(0) : -Load<T>(x, tx, i * c + t);
  }
}

template <typename T>
__global__ void NllBackwardKernel(const void* grad, ElemType tg, bool per_row_grad, const int64_t* target, void* out,
                                  ElemType to, int64_t n, int64_t c, int64_t ignore_index, bool mean, T denom) {
  FSDP_GRID_STRIDE_LOOP(i, n) {
    const int64_t t = target[i];
    if (t == ignore_index) continue;
    const T gi = Load<T>(grad, tg, per_row_grad ? i : 0);
    Store<T>(out, to, i * c + t, mean ? -gi / denom : -gi);
  }
}

}  // namespace

Tensor NllLoss(const Tensor& log_probs, const Tensor& target, Reduction reduction, int64_t ignore_index,
               int64_t valid) {
  const int64_t n = log_probs.size(0), c = log_probs.size(1);
  const DType cd = internal::ComputeDType(log_probs.dtype());
  Tensor per_row = Tensor::zeros({n}, cd, log_probs.device());
  if (n > 0) {
    DeviceGuard guard(log_probs.device());
    const LaunchConfig cfg = GridFor(n);
    DispatchFloatCompute(cd, "nll_loss", [&](auto tag) {
      using T = decltype(tag);
      NllRowsKernel<T><<<cfg.blocks, cfg.threads, 0, StreamOf(log_probs.device())>>>(
          log_probs.data_ptr(), Elem(log_probs.dtype()), target.data<int64_t>(), per_row.data_ptr(), n, c,
          ignore_index);
    });
    CheckLaunch("nll_loss kernel");
  }
  if (reduction == Reduction::kNone) return Cast(per_row, log_probs.dtype());
  Tensor total = SumDims(per_row, {0}, cd).view({});
  if (reduction == Reduction::kMean) {
    total = Unary("nll_loss", UnaryOp::kDivScalar, static_cast<double>(valid), total, cd);
  }
  return Cast(total, log_probs.dtype());
}

Tensor NllLossBackward(const Tensor& grad, const Tensor& log_probs, const Tensor& target, Reduction reduction,
                       int64_t ignore_index, int64_t valid) {
  const int64_t n = log_probs.size(0), c = log_probs.size(1);
  Tensor out = Tensor::zeros({n, c}, log_probs.dtype(), log_probs.device());
  if (n == 0) return out;
  const DType cd = internal::ComputeDType(log_probs.dtype());
  const Tensor g = grad.device() == log_probs.device() ? grad : grad.to(log_probs.device());
  DeviceGuard guard(log_probs.device());
  const LaunchConfig cfg = GridFor(n);
  DispatchFloatCompute(cd, "nll_loss_backward", [&](auto tag) {
    using T = decltype(tag);
    NllBackwardKernel<T><<<cfg.blocks, cfg.threads, 0, StreamOf(log_probs.device())>>>(
        g.data_ptr(), Elem(g.dtype()), reduction == Reduction::kNone, target.data<int64_t>(), out.data_ptr(),
        Elem(out.dtype()), n, c, ignore_index, reduction == Reduction::kMean, static_cast<T>(valid));
  });
  CheckLaunch("nll_loss_backward kernel");
  return out;
}

}  // namespace fsdp::ops::kernels::cuda
