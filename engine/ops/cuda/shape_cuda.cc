// CUDA shape ops that only move bytes: narrow, its backward and cat, each one 2-D strided copy
// (cudaMemcpy2DAsync) per operand on the current stream. Host code; no kernels.
#include "engine/ops/cuda/cuda_host_util.h"
#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

// For each of `outer` rows, copies len * inner elements from src (row pitch src_dim * inner,
// starting at src_start * inner) to dst (row pitch dst_dim * inner, at dst_start * inner):
// the device version of shape_ops.cc's CopySlabs.
void CopySlabs(const Tensor& src, int64_t src_dim, int64_t src_start, Tensor& dst, int64_t dst_dim,
               int64_t dst_start, int64_t outer, int64_t len, int64_t inner) {
  const size_t es = dst.element_size();
  const size_t width = static_cast<size_t>(len * inner) * es;
  if (width == 0 || outer == 0) return;
  DeviceGuard guard(dst.device());
  const char* s = static_cast<const char*>(src.data_ptr()) + static_cast<size_t>(src_start * inner) * es;
  char* d = static_cast<char*>(dst.data_ptr()) + static_cast<size_t>(dst_start * inner) * es;
  CudaCheck(cudaMemcpy2DAsync(d, static_cast<size_t>(dst_dim * inner) * es, s, static_cast<size_t>(src_dim * inner) * es,
                              width, static_cast<size_t>(outer), cudaMemcpyDeviceToDevice, StreamOf(dst.device())),
            "cudaMemcpy2DAsync");
}

}  // namespace

Tensor Narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Shape out_shape = x.sizes();
  const int64_t size = out_shape[static_cast<size_t>(dim)];
  out_shape[static_cast<size_t>(dim)] = length;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  CopySlabs(x, size, start, out, length, 0, internal::ProdRange(x.sizes(), 0, dim), length,
            internal::ProdRange(x.sizes(), dim + 1, x.dim()));
  return out;
}

Tensor NarrowBackward(const Tensor& grad, const Shape& input_shape, int64_t dim, int64_t start) {
  const int64_t nd = static_cast<int64_t>(input_shape.size());
  const int64_t size = input_shape[static_cast<size_t>(dim)];
  const int64_t len = grad.size(dim);
  Tensor out = Tensor::zeros(input_shape, grad.dtype(), grad.device());
  CopySlabs(grad, len, 0, out, size, start, internal::ProdRange(input_shape, 0, dim), len,
            internal::ProdRange(input_shape, dim + 1, nd));
  return out;
}

Tensor Cat(const std::vector<Tensor>& parts, int64_t dim, DType dtype) {
  const Tensor& ref = parts[0];
  int64_t total = 0;
  for (const Tensor& t : parts) total += t.sizes()[static_cast<size_t>(dim)];
  Shape out_shape = ref.sizes();
  out_shape[static_cast<size_t>(dim)] = total;
  Tensor out = Tensor::empty(out_shape, dtype, ref.device());
  const int64_t outer = internal::ProdRange(out_shape, 0, dim);
  const int64_t inner = internal::ProdRange(out_shape, dim + 1, ref.dim());
  int64_t offset = 0;
  for (const Tensor& t : parts) {
    const int64_t len = t.sizes()[static_cast<size_t>(dim)];
    CopySlabs(Cast(t, dtype), len, 0, out, total, offset, outer, len, inner);
    offset += len;
  }
  return out;
}

}  // namespace fsdp::ops::kernels::cuda
