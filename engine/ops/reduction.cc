#include "engine/ops/reduction.h"

#include <algorithm>

#include <Eigen/Core>

#include "engine/ops/broadcast.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

namespace {

using internal::ProdRange;

// Sorted, wrapped, de-duplicated-checked dims; an empty list means every dimension (PyTorch's
// sum(dim=[]) reduces everything).
std::vector<int64_t> NormalizeDims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) {
    const int64_t w = internal::WrapDim(d, ndim, op);
    FSDP_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", w,
               " appears multiple times in the list of dims");
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  if (ndim == 0) out.clear();  // reducing a 0-d tensor over dim 0 is the identity
  return out;
}

// Sums the middle dimension of a contiguous [outer, n, inner] block.
template <typename T>
void SumMiddle(const T* x, T* out, int64_t outer, int64_t n, int64_t inner) {
  using Row = Eigen::Array<T, 1, Eigen::Dynamic>;
  for (int64_t o = 0; o < outer; ++o) {
    const T* base = x + o * n * inner;
    T* dst = out + o * inner;
    if (inner == 1) {
      dst[0] = Eigen::Map<const Row>(base, n).sum();
    } else {
      Eigen::Map<Row> acc(dst, inner);
      acc.setZero();
      for (int64_t k = 0; k < n; ++k) acc += Eigen::Map<const Row>(base + k * inner, inner);
    }
  }
}

Tensor SumNative(const Tensor& x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x.clone();  // a 0-d input: the result is still a new tensor
  return internal::DispatchNumeric(x.dtype(), "sum", [&](auto tag) {
    using T = decltype(tag);
    Tensor cur = x;
    Shape shape = x.sizes();
    // Reduce the highest dims first so earlier dim indices stay valid; dims already reduced
    // keep size 1.
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
      const int64_t d = *it;
      const int64_t outer = ProdRange(shape, 0, d);
      const int64_t n = shape[static_cast<size_t>(d)];
      const int64_t inner = ProdRange(shape, d + 1, static_cast<int64_t>(shape.size()));
      shape[static_cast<size_t>(d)] = 1;
      Tensor next = Tensor::zeros(shape, x.dtype());
      if (n > 0) SumMiddle<T>(cur.data<T>(), next.data<T>(), outer, n, inner);
      cur = next;
    }
    return cur;
  });
}

}  // namespace

Shape ReducedShape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  const std::vector<int64_t> nd = NormalizeDims(dims, static_cast<int64_t>(shape.size()), op);
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    const bool reduced = std::binary_search(nd.begin(), nd.end(), i);
    if (!reduced) {
      out.push_back(shape[static_cast<size_t>(i)]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

Tensor Sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  internal::CheckDefined("sum", "self", x);
  const std::vector<int64_t> nd = NormalizeDims(dims, x.dim(), "sum");
  const Shape out_shape = ReducedShape(x.sizes(), nd, keepdim, "sum");
  if (internal::OnCuda("sum", {&x})) return FSDP_CUDA_KERNEL("sum", SumDims(x, nd, x.dtype())).view(out_shape);
  if (!internal::IsNative(x)) {
    return internal::RestoreLike(Sum(internal::ToCompute(x), dims, keepdim), x);
  }
  Tensor r = SumNative(x, nd);
  return r.view(out_shape);
}

Tensor Sum(const Tensor& x) {
  internal::CheckDefined("sum", "self", x);
  if (x.dim() == 0) return x.clone();
  // A flat reduction: view as one dimension.
  return Sum(x.view({x.numel()}), {0}, false);
}

Tensor Mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  internal::CheckFloating("mean", "self", x);
  const std::vector<int64_t> nd = NormalizeDims(dims, x.dim(), "mean");
  int64_t count = 1;
  for (int64_t d : nd) count *= x.sizes()[static_cast<size_t>(d)];
  if (internal::OnCuda("mean", {&x})) {
    return FSDP_CUDA_KERNEL("mean", Mean(x, nd, ReducedShape(x.sizes(), nd, keepdim, "mean")));
  }
  if (!internal::IsNative(x)) {
    return internal::RestoreLike(Mean(internal::ToCompute(x), dims, keepdim), x);
  }
  return DivScalar(Sum(x, dims, keepdim), static_cast<double>(count));
}

Tensor Mean(const Tensor& x) {
  internal::CheckFloating("mean", "self", x);
  if (internal::OnCuda("mean", {&x})) return Mean(x.dim() > 0 ? x.view({x.numel()}) : x, {}, false);
  if (!internal::IsNative(x)) return internal::RestoreLike(Mean(internal::ToCompute(x)), x);
  return DivScalar(Sum(x), static_cast<double>(x.numel()));
}

Tensor SumBackward(const Tensor& grad, const Shape& input_shape, const std::vector<int64_t>& dims,
                   bool keepdim) {
  const Shape kept = ReducedShape(input_shape, dims, true, "sum_backward");
  FSDP_CHECK(grad.numel() == Numel(kept), "sum_backward: gradient ", grad.str(),
             " does not match the reduced shape ", ShapeStr(kept), " of input ", ShapeStr(input_shape));
  (void)keepdim;  // with or without keepdim, the gradient has the kept shape's elements
  return Expand(grad.view(kept), input_shape);
}

Tensor MeanBackward(const Tensor& grad, const Shape& input_shape, const std::vector<int64_t>& dims,
                    bool keepdim) {
  const std::vector<int64_t> nd = NormalizeDims(dims, static_cast<int64_t>(input_shape.size()), "mean_backward");
  int64_t count = 1;
  for (int64_t d : nd) count *= input_shape[static_cast<size_t>(d)];
  return SumBackward(DivScalar(grad, static_cast<double>(count)), input_shape, dims, keepdim);
}

Tensor SumBackward(const Tensor& grad, const Shape& input_shape) {
  FSDP_CHECK(grad.numel() == 1, "sum_backward: expected a single-element gradient, got ", grad.str());
  Shape ones(input_shape.size(), 1);
  return Expand(grad.view(ones), input_shape);
}

Tensor MeanBackward(const Tensor& grad, const Shape& input_shape) {
  return SumBackward(DivScalar(grad, static_cast<double>(Numel(input_shape))), input_shape);
}

}  // namespace fsdp::ops::kernels
