// CUDA reductions: sums over dimensions (one dimension at a time, highest first, like the CPU
// kernel), mean and sum_to_size. Every output element is reduced by one warp (rows of a
// contiguous last dimension) or one thread (strided columns) in a fixed order, so results are
// deterministic run to run.
#include <cuda_runtime.h>

#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

// [outer, n, 1] -> [outer]: one warp per output element.
template <typename T>
__global__ void SumRowsKernel(const void* x, ElemType tx, void* out, ElemType to, int64_t outer, int64_t n) {
  for (int64_t row = GlobalWarp(); row < outer; row += WarpCount()) {
    T acc = T(0);
    for (int64_t j = Lane(); j < n; j += kWarpSize) acc += Load<T>(x, tx, row * n + j);
    acc = WarpSum(acc);
    if (Lane() == 0) Store<T>(out, to, row, acc);
  }
}

// [outer, n, inner] -> [outer, inner] with inner > 1: one thread per output element.
template <typename T>
__global__ void SumMiddleKernel(const void* x, ElemType tx, void* out, ElemType to, int64_t outer, int64_t n,
                                int64_t inner) {
  FSDP_GRID_STRIDE_LOOP(i, outer * inner) {
    const int64_t o = i / inner, k = i % inner;
    T acc = T(0);
    for (int64_t j = 0; j < n; ++j) acc += Load<T>(x, tx, (o * n + j) * inner + k);
    Store<T>(out, to, i, acc);
  }
}

template <typename T>
void LaunchSum(const Tensor& x, Tensor& out, const SliceLayout& l, cudaStream_t stream) {
  if (l.inner == 1) {
    const LaunchConfig c = WarpPerRow(l.outer);
    SumRowsKernel<T><<<c.blocks, c.threads, 0, stream>>>(x.data_ptr(), Elem(x.dtype()), out.data_ptr(),
                                                         Elem(out.dtype()), l.outer, l.n);
  } else {
    const LaunchConfig c = GridFor(l.outer * l.inner);
    SumMiddleKernel<T><<<c.blocks, c.threads, 0, stream>>>(x.data_ptr(), Elem(x.dtype()), out.data_ptr(),
                                                           Elem(out.dtype()), l.outer, l.n, l.inner);
  }
  CheckLaunch("sum kernel");
}

}  // namespace

Tensor SumDims(const Tensor& x, const std::vector<int64_t>& dims, DType out_dtype) {
  if (dims.empty()) return x.dtype() == out_dtype ? x.clone() : Cast(x, out_dtype);
  const DType cd = internal::ComputeDType(x.dtype());
  DeviceGuard guard(x.device());
  cudaStream_t stream = StreamOf(x.device());
  Tensor cur = x;
  Shape shape = x.sizes();
  for (size_t r = dims.size(); r-- > 0;) {
    const int64_t d = dims[r];
    const SliceLayout l = LayoutAround(shape, d);
    shape[static_cast<size_t>(d)] = 1;
    // Intermediate steps stay in the compute dtype; the last one writes out_dtype.
    Tensor next = Tensor::zeros(shape, r == 0 ? out_dtype : cd, x.device());
    if (l.n > 0 && next.numel() > 0) {
      if (cd == DType::kFloat64) {
        LaunchSum<double>(cur, next, l, stream);
      } else if (cd == DType::kInt64) {
        LaunchSum<int64_t>(cur, next, l, stream);
      } else {
        LaunchSum<float>(cur, next, l, stream);
      }
    }
    cur = next;
  }
  return cur;
}

Tensor Mean(const Tensor& x, const std::vector<int64_t>& dims, const Shape& out_shape) {
  const DType cd = internal::ComputeDType(x.dtype());
  int64_t count = 1;
  for (int64_t d : dims) count *= x.sizes()[static_cast<size_t>(d)];
  const Tensor sum = SumDims(x, dims, cd);
  const Tensor mean = Unary("mean", UnaryOp::kDivScalar, static_cast<double>(count), sum, cd);
  return Cast(mean, x.dtype()).view(out_shape);
}

Tensor SumToShape(const Tensor& grad, const Shape& shape) {
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < grad.dim(); ++i) {
    const bool reduce = i < lead || (shape[static_cast<size_t>(i - lead)] == 1 && grad.sizes()[static_cast<size_t>(i)] != 1);
    if (reduce) dims.push_back(i);
  }
  return SumDims(grad, dims, grad.dtype()).view(shape);
}

}  // namespace fsdp::ops::kernels::cuda
