#include "engine/ops/broadcast.h"

#include <algorithm>
#include <cstring>

#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

using internal::BroadcastStrides;
using internal::ForEachRow;

Shape BroadcastShapes(const Shape& a, const Shape& b, const char* op) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd, 1);
  for (size_t k = 0; k < nd; ++k) {
    const int64_t sa = k < a.size() ? a[a.size() - 1 - k] : 1;
    const int64_t sb = k < b.size() ? b[b.size() - 1 - k] : 1;
    FSDP_CHECK(sa == sb || sa == 1 || sb == 1, op, ": the size of tensor a (", sa,
               ") must match the size of tensor b (", sb, ") at non-singleton dimension ",
               nd - 1 - k, "; shapes ", ShapeStr(a), " and ", ShapeStr(b),
               " are not broadcastable");
    out[nd - 1 - k] = sa == 1 ? sb : sa;
  }
  return out;
}

namespace {

int Rank(DType d) {
  switch (d) {
    case DType::kInt64: return 0;
    case DType::kFloat16: return 1;
    case DType::kBFloat16: return 1;
    case DType::kFloat32: return 2;
    case DType::kFloat64: return 3;
  }
  return 0;
}

}  // namespace

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::kFloat16 && b == DType::kBFloat16) || (a == DType::kBFloat16 && b == DType::kFloat16)) {
    return DType::kFloat32;
  }
  return Rank(a) >= Rank(b) ? a : b;
}

DType ResultType(const Tensor& a, const Tensor& b) {
  const bool a_scalar = a.dim() == 0, b_scalar = b.dim() == 0;
  if (a_scalar != b_scalar && IsFloatingPoint(a.dtype()) == IsFloatingPoint(b.dtype())) {
    return a_scalar ? b.dtype() : a.dtype();
  }
  return PromoteTypes(a.dtype(), b.dtype());
}

DType ResultTypeWithScalar(const Tensor& t, double scalar) {
  if (IsFloatingPoint(t.dtype())) return t.dtype();
  return scalar == static_cast<double>(static_cast<int64_t>(scalar)) ? DType::kInt64 : DType::kFloat32;
}

Tensor Expand(const Tensor& x, const Shape& shape) {
  internal::CheckDefined("expand", "self", x);
  if (x.sizes() == shape) return x;
  FSDP_CHECK(shape.size() >= x.sizes().size(), "expand: the number of sizes provided (",
             shape.size(), ") must be greater or equal to the number of dimensions in the tensor (",
             x.dim(), "); ", ShapeStr(x.sizes()), " to ", ShapeStr(shape));
  FSDP_CHECK(BroadcastShapes(x.sizes(), shape, "expand") == shape, "expand: cannot expand ",
             ShapeStr(x.sizes()), " to ", ShapeStr(shape));
  if (internal::OnCuda("expand", {&x})) return FSDP_CUDA_KERNEL("expand", Expand(x, shape));
  Tensor out = Tensor::empty(shape, x.dtype());
  const size_t es = x.element_size();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  std::array<std::vector<int64_t>, 1> strides = {BroadcastStrides(x.sizes(), shape)};
  ForEachRow<1>(shape, strides, [&](int64_t row, const std::array<int64_t, 1>& off, int64_t len,
                                    const std::array<int64_t, 1>& inner) {
    char* d = dst + static_cast<size_t>(row * len) * es;
    if (inner[0] == 1) {
      std::memcpy(d, src + static_cast<size_t>(off[0]) * es, static_cast<size_t>(len) * es);
    } else {
      for (int64_t j = 0; j < len; ++j) {
        std::memcpy(d + static_cast<size_t>(j) * es, src + static_cast<size_t>(off[0] + j * inner[0]) * es, es);
      }
    }
  });
  return out;
}

Tensor SumToShape(const Tensor& grad, const Shape& shape) {
  internal::CheckDefined("sum_to_size", "grad", grad);
  if (grad.sizes() == shape) return grad;
  FSDP_CHECK(BroadcastShapes(shape, grad.sizes(), "sum_to_size") == grad.sizes(), "sum_to_size: size ",
             ShapeStr(shape), " is not expandable to size ", ShapeStr(grad.sizes()));
  if (internal::OnCuda("sum_to_size", {&grad})) return FSDP_CUDA_KERNEL("sum_to_size", SumToShape(grad, shape));
  if (!internal::IsNative(grad)) return internal::RestoreLike(SumToShape(internal::ToCompute(grad), shape), grad);
  return internal::DispatchNumeric(grad.dtype(), "sum_to_size", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::zeros(shape, grad.dtype());
    T* o = out.data<T>();
    const T* g = grad.data<T>();
    std::array<std::vector<int64_t>, 1> strides = {BroadcastStrides(shape, grad.sizes())};
    ForEachRow<1>(grad.sizes(), strides, [&](int64_t row, const std::array<int64_t, 1>& off,
                                             int64_t len, const std::array<int64_t, 1>& inner) {
      const T* gr = g + row * len;
      T* orow = o + off[0];
      if (inner[0] == 0) {
        T acc = T(0);
        for (int64_t j = 0; j < len; ++j) acc += gr[j];
        orow[0] += acc;
      } else {
        for (int64_t j = 0; j < len; ++j) orow[j] += gr[j];
      }
    });
    return out;
  });
}

}  // namespace fsdp::ops::kernels
