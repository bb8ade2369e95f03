// Internal helpers shared by the CPU kernels of engine/ops (not part of the public API).
//
// Kernels compute natively on CPU float32/float64 (and int64 where an op allows it). Other
// inputs go through a "compute copy": float16/bfloat16 are widened to float32 and tensors on
// another device are staged on the host; results are converted back to the caller's dtype and
// device, rounding to nearest even through the core conversions.
// Thread-safety: stateless functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/ops/shape_ops.h"

namespace fsdp::ops::kernels::internal {

using kernels::Cast;

inline bool IsReducedFloat(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// The dtype a kernel computes in for tensors of `dtype`: float32 for float16/bfloat16,
// otherwise `dtype` itself (OpMathDType, engine/core/dtype.h [Note: opmath type]).
inline DType ComputeDType(DType dtype) { return OpMathDType(dtype); }

// True when `t` can be used by a kernel as is: a CPU tensor of its own compute dtype.
inline bool IsNative(const Tensor& t) {
  return !t.defined() || (t.device().is_cpu() && !IsReducedFloat(t.dtype()));
}

// A CPU copy of `t` in `dtype` (returns `t` itself when nothing changes; undefined stays
// undefined).
inline Tensor HostAs(const Tensor& t, DType dtype) {
  if (!t.defined()) return t;
  Tensor host = t.device().is_cpu() ? t : t.to(Device::CPU());
  return host.to(dtype);
}

// A CPU copy of `t` in its compute dtype.
inline Tensor ToCompute(const Tensor& t) {
  if (!t.defined()) return t;
  return HostAs(t, ComputeDType(t.dtype()));
}

// Converts a kernel result back to `dtype` on `device` (the dtype conversion runs on the
// result's device: kernels::Cast dispatches CUDA tensors to the CUDA cast kernel).
inline Tensor Restore(const Tensor& result, DType dtype, Device device) {
  if (!result.defined()) return result;
  Tensor out = Cast(result, dtype);
  return out.device() == device ? out : out.to(device);
}
inline Tensor RestoreLike(const Tensor& result, const Tensor& like) {
  return like.defined() ? Restore(result, like.dtype(), like.device()) : result;
}

inline int64_t WrapDim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = ndim == 0 ? 1 : ndim;  // 0-d tensors accept dim 0 and -1, like PyTorch
  const int64_t wrapped = dim < 0 ? dim + n : dim;
  FSDP_CHECK(wrapped >= 0 && wrapped < n, op, ": dimension ", dim,
             " out of range (expected to be in range of [", -n, ", ", n - 1, "])");
  return wrapped;
}

inline void CheckDefined(const char* op, const char* name, const Tensor& t) {
  FSDP_CHECK(t.defined(), op, ": argument '", name, "' is an undefined tensor");
}

inline void CheckFloating(const char* op, const char* name, const Tensor& t) {
  CheckDefined(op, name, t);
  FSDP_CHECK(IsFloatingPoint(t.dtype()), op, ": argument '", name,
             "' must be a floating-point tensor, got ", t.str());
}

// Product of sizes[begin, end).
inline int64_t ProdRange(const Shape& sizes, int64_t begin, int64_t end) {
  int64_t p = 1;
  for (int64_t i = begin; i < end; ++i) p *= sizes[static_cast<size_t>(i)];
  return p;
}

// Calls fn(T{}) for float or double compute dtypes.
template <typename Fn>
decltype(auto) DispatchFloat(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    default: break;
  }
  FSDP_THROW(ErrorCode::kInternal, op, ": kernel called with non-compute dtype ", DTypeName(dtype));
}

// Calls fn(T{}) for float, double or int64 compute dtypes.
template <typename Fn>
decltype(auto) DispatchNumeric(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kInt64: return fn(int64_t{});
    default: break;
  }
  FSDP_THROW(ErrorCode::kInternal, op, ": kernel called with non-compute dtype ", DTypeName(dtype));
}

// Element strides of a contiguous tensor of `shape` read as the (broadcast) shape `out_shape`:
// 0 on dimensions that are broadcast (missing or of size 1 where out_shape is larger).
inline std::vector<int64_t> BroadcastStrides(const Shape& shape, const Shape& out_shape) {
  const size_t nd = out_shape.size();
  std::vector<int64_t> strides(nd, 0);
  int64_t stride = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    const size_t src = shape.size() - 1 - k;
    const size_t dst = nd - 1 - k;
    strides[dst] = (shape[src] == 1 && out_shape[dst] != 1) ? 0 : stride;
    stride *= shape[src];
  }
  return strides;
}

// Walks a contiguous iteration space of shape `shape` row by row (a row is the last dimension;
// a 0-d shape is one row of one element). For each row calls
// fn(row_index, offsets, row_length, inner_strides) where offsets[i] is the element offset of
// the row's first element in operand i (given by its strides over `shape`).
template <size_t N, typename Fn>
void ForEachRow(const Shape& shape, const std::array<std::vector<int64_t>, N>& strides, Fn&& fn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t numel = Numel(shape);
  if (numel == 0) return;
  const int64_t len = nd == 0 ? 1 : shape.back();
  std::array<int64_t, N> inner{};
  for (size_t i = 0; i < N; ++i) inner[i] = nd == 0 ? 0 : strides[i].back();
  const int64_t rows = numel / len;
  std::vector<int64_t> index(static_cast<size_t>(nd > 0 ? nd - 1 : 0), 0);
  std::array<int64_t, N> offsets{};
  for (int64_t r = 0; r < rows; ++r) {
    fn(r, offsets, len, inner);
    // Advance the odometer over dims [0, nd-1).
    for (int64_t d = nd - 2; d >= 0; --d) {
      const size_t du = static_cast<size_t>(d);
      ++index[du];
      for (size_t i = 0; i < N; ++i) offsets[i] += strides[i][du];
      if (index[du] < shape[du]) break;
      for (size_t i = 0; i < N; ++i) offsets[i] -= strides[i][du] * shape[du];
      index[du] = 0;
    }
  }
}

}  // namespace fsdp::ops::kernels::internal
