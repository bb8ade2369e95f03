// CUDA softmax / log_softmax over any dimension and their backward: one warp per slice along
// the reduced dimension (lanes stride the slice; fixed-order warp reductions), the same
// max-subtracted formulas as the CPU kernels. Pointwise activations (relu, gelu) are
// BinaryOp codes of elementwise_cuda.cu.
#include <cuda_runtime.h>

#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

template <typename T, bool kLog>
__global__ void SoftmaxKernel(const void* x, ElemType tx, void* out, ElemType to, SliceLayout l) {
  const int64_t slices = l.outer * l.inner;
  for (int64_t s = GlobalWarp(); s < slices; s += WarpCount()) {
    const int64_t base = l.Base(s);
    T mx = -Infinity<T>();
    for (int64_t j = Lane(); j < l.n; j += kWarpSize) {
      const T v = Load<T>(x, tx, base + j * l.inner);
      mx = v > mx ? v : mx;
    }
    mx = WarpMax(mx);
    if (mx == -Infinity<T>()) mx = T(0);  // an all -inf row: avoid inf - inf
    T sum = T(0);
    for (int64_t j = Lane(); j < l.n; j += kWarpSize) sum += Exp(Load<T>(x, tx, base + j * l.inner) - mx);
    sum = WarpSum(sum);
    if constexpr (kLog) {
      const T lse = Log(sum);
      for (int64_t j = Lane(); j < l.n; j += kWarpSize) {
        const int64_t k = base + j * l.inner;
        Store<T>(out, to, k, Load<T>(x, tx, k) - mx - lse);
      }
    } else {
      const T inv = T(1) / sum;
      for (int64_t j = Lane(); j < l.n; j += kWarpSize) {
        const int64_t k = base + j * l.inner;
        Store<T>(out, to, k, Exp(Load<T>(x, tx, k) - mx) * inv);
      }
    }
  }
}

template <typename T, bool kLog>
__global__ void SoftmaxBackwardKernel(const void* g, ElemType tg, const void* y, ElemType ty, void* out, ElemType to,
                                      SliceLayout l) {
  const int64_t slices = l.outer * l.inner;
  for (int64_t s = GlobalWarp(); s < slices; s += WarpCount()) {
    const int64_t base = l.Base(s);
    T dot = T(0);
    for (int64_t j = Lane(); j < l.n; j += kWarpSize) {
      const int64_t k = base + j * l.inner;
      dot += kLog ? Load<T>(g, tg, k) : Load<T>(g, tg, k) * Load<T>(y, ty, k);
    }
    dot = WarpSum(dot);
    for (int64_t j = Lane(); j < l.n; j += kWarpSize) {
      const int64_t k = base + j * l.inner;
      const T gk = Load<T>(g, tg, k), yk = Load<T>(y, ty, k);
      Store<T>(out, to, k, kLog ? gk - Exp(yk) * dot : yk * (gk - dot));
    }
  }
}

template <bool kLog>
void LaunchSoftmax(const Tensor& x, Tensor& out, const SliceLayout& l, DType cd) {
  const LaunchConfig c = WarpPerRow(l.slices());
  cudaStream_t stream = StreamOf(x.device());
  DispatchFloatCompute(cd, "softmax", [&](auto tag) {
    using T = decltype(tag);
    SoftmaxKernel<T, kLog><<<c.blocks, c.threads, 0, stream>>>(x.data_ptr(), Elem(x.dtype()), out.data_ptr(),
                                                               Elem(out.dtype()), l);
  });
  CheckLaunch("softmax kernel");
}

template <bool kLog>
void LaunchSoftmaxBackward(const Tensor& g, const Tensor& y, Tensor& out, const SliceLayout& l, DType cd) {
  const LaunchConfig c = WarpPerRow(l.slices());
  cudaStream_t stream = StreamOf(y.device());
  DispatchFloatCompute(cd, "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    SoftmaxBackwardKernel<T, kLog><<<c.blocks, c.threads, 0, stream>>>(
        g.data_ptr(), Elem(g.dtype()), y.data_ptr(), Elem(y.dtype()), out.data_ptr(), Elem(out.dtype()), l);
  });
  CheckLaunch("softmax_backward kernel");
}

}  // namespace

Tensor Softmax(const Tensor& x, int64_t dim, bool log) {
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const SliceLayout l = LayoutAround(x.sizes(), dim);
  const DType cd = internal::ComputeDType(x.dtype());
  DeviceGuard guard(x.device());
  if (log) {
    LaunchSoftmax<true>(x, out, l, cd);
  } else {
    LaunchSoftmax<false>(x, out, l, cd);
  }
  return out;
}

Tensor SoftmaxBackward(const Tensor& grad, const Tensor& result, int64_t dim, bool log) {
  Tensor out = Tensor::empty(result.sizes(), result.dtype(), result.device());
  if (out.numel() == 0) return out;
  const SliceLayout l = LayoutAround(result.sizes(), dim);
  const DType cd = internal::ComputeDType(result.dtype());
  DeviceGuard guard(result.device());
  if (log) {
    LaunchSoftmaxBackward<true>(grad, result, out, l, cd);
  } else {
    LaunchSoftmaxBackward<false>(grad, result, out, l, cd);
  }
  return out;
}

}  // namespace fsdp::ops::kernels::cuda
