// CUDA elementwise kernels: broadcasting binary ops, unary/scalar ops, strided gathers
// (expand, permute) and dtype casts. One kernel per family, templated only on the compute
// type (float, double, int64); operand dtypes and the op are runtime switches, which keeps the
// number of instantiations (and compile time) small.
#include <cuda_runtime.h>

#include "engine/core/cuda_convert.h"
#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/ops/kernel_util.h"
#include "engine/ops/broadcast.h"

namespace fsdp::ops::kernels::cuda {

namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kKappa = 0.044715;

template <typename T>
__device__ T PowValue(T x, double e) {
  if (e == 2.0) return x * x;
  if (e == 3.0) return x * x * x;
  if (e == 1.0) return x;
  if (e == 0.5) return Sqrt(x);
  if (e == -0.5) return T(1) / Sqrt(x);
  if (e == -1.0) return T(1) / x;
  if (e == -2.0) return T(1) / (x * x);
  return Pow(x, static_cast<T>(e));
}

template <typename T>
__device__ T ApplyFloatBinary(BinaryOp op, T a, T b, double s) {
  switch (op) {
    case BinaryOp::kDiv: return a / b;
    case BinaryOp::kPowBackward: return a * (static_cast<T>(s) * PowValue(b, s - 1.0));
    case BinaryOp::kSqrtBackward: return a / (T(2) * b);
    case BinaryOp::kRsqrtBackward: return T(-0.5) * a * (b * b * b);
    case BinaryOp::kReciprocalBackward: return -a * (b * b);
    case BinaryOp::kRelu: return a > T(0) ? a : (IsNan(a) ? a : T(0));
    case BinaryOp::kReluBackward: return b > T(0) ? a : T(0);
    case BinaryOp::kGelu: return a * T(0.5) * (T(1) + Erf(a * T(kSqrt1_2)));
    case BinaryOp::kGeluTanh: {
      const T inner = T(kSqrt2OverPi) * (a + T(kKappa) * a * a * a);
      return T(0.5) * a * (T(1) + Tanh(inner));
    }
    case BinaryOp::kGeluBackward: {
      const T cdf = T(0.5) * (T(1) + Erf(b * T(kSqrt1_2)));
      const T pdf = T(kInvSqrt2Pi) * Exp(T(-0.5) * b * b);
      return a * (cdf + b * pdf);
    }
    case BinaryOp::kGeluTanhBackward: {
      const T x_sq = b * b;
      const T inner = T(kSqrt2OverPi) * (b + T(kKappa) * x_sq * b);
      const T tanh_inner = Tanh(inner);
      const T left = T(0.5) * b;
      const T right = T(1) + tanh_inner;
      const T left_derivative = T(0.5) * right;
      const T tanh_derivative = T(1) - tanh_inner * tanh_inner;
      const T inner_derivative = T(kSqrt2OverPi) * (T(1) + T(3) * T(kKappa) * x_sq);
      return a * (left_derivative + left * tanh_derivative * inner_derivative);
    }
    default: return T(0);
  }
}

template <typename T>
__device__ T ApplyBinary(BinaryOp op, T a, T b, double s) {
  switch (op) {
    case BinaryOp::kAdd: return s == 1.0 ? a + b : a + static_cast<T>(s) * b;
    case BinaryOp::kSub: return s == 1.0 ? a - b : a - static_cast<T>(s) * b;
    case BinaryOp::kMul: return a * b;
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    return ApplyFloatBinary(op, a, b, s);
  } else {
    return T(0);  // int64 is rejected on the host for the other ops
  }
}

template <typename T>
__global__ void BinaryKernel(BinaryOp op, double s, const void* a, ElemType ta, StridedIndexer ia, const void* b,
                             ElemType tb, StridedIndexer ib, void* out, ElemType to, int64_t n) {
  FSDP_GRID_STRIDE_LOOP(i, n) {
    const T x = Load<T>(a, ta, ia.Offset(i));
    const T y = Load<T>(b, tb, ib.Offset(i));
    Store<T>(out, to, i, ApplyBinary<T>(op, x, y, s));
  }
}

template <typename T>
__device__ T ApplyUnary(UnaryOp op, T v, double s) {
  switch (op) {
    case UnaryOp::kNeg: return -v;
    case UnaryOp::kAddScalar: return v + static_cast<T>(s);
    case UnaryOp::kMulScalar: return v * static_cast<T>(s);
    case UnaryOp::kRSubScalar: return static_cast<T>(s) - v;
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case UnaryOp::kExp: return Exp(v);
      case UnaryOp::kLog: return Log(v);
      case UnaryOp::kSqrt: return Sqrt(v);
      case UnaryOp::kRsqrt: return T(1) / Sqrt(v);
      case UnaryOp::kReciprocal: return T(1) / v;
      case UnaryOp::kDivScalar: return v / static_cast<T>(s);
      case UnaryOp::kPow: return PowValue(v, s);
      default: break;
    }
  }
  return T(0);
}

template <typename T>
__global__ void UnaryKernel(UnaryOp op, double s, const void* x, ElemType tx, void* out, ElemType to, int64_t n) {
  FSDP_GRID_STRIDE_LOOP(i, n) { Store<T>(out, to, i, ApplyUnary<T>(op, Load<T>(x, tx, i), s)); }
}

// out[i] = in[indexer.Offset(i)] for elements of `Word` (2, 4 or 8 bytes).
template <typename Word>
__global__ void GatherKernel(const Word* in, StridedIndexer ix, Word* out, int64_t n) {
  FSDP_GRID_STRIDE_LOOP(i, n) { out[i] = in[ix.Offset(i)]; }
}

__global__ void CastKernel(const void* in, ElemType ti, void* out, ElemType to, int64_t n) {
  FSDP_GRID_STRIDE_LOOP(i, n) {
    if (ti == ElemType::kFloat32 && (to == ElemType::kFloat16 || to == ElemType::kBFloat16)) {
      StoreFloat(out, to, i, static_cast<const float*>(in)[i]);
    } else {
      StoreDouble(out, to, i, LoadDouble(in, ti, i));
    }
  }
}

void Gather(const Tensor& x, const StridedIndexer& ix, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  const LaunchConfig c = GridFor(n);
  cudaStream_t stream = StreamOf(out.device());
  switch (x.element_size()) {
    case 2:
      GatherKernel<uint16_t><<<c.blocks, c.threads, 0, stream>>>(static_cast<const uint16_t*>(x.data_ptr()), ix,
                                                                 static_cast<uint16_t*>(out.data_ptr()), n);
      break;
    case 4:
      GatherKernel<uint32_t><<<c.blocks, c.threads, 0, stream>>>(static_cast<const uint32_t*>(x.data_ptr()), ix,
                                                                 static_cast<uint32_t*>(out.data_ptr()), n);
      break;
    default:
      GatherKernel<uint64_t><<<c.blocks, c.threads, 0, stream>>>(static_cast<const uint64_t*>(x.data_ptr()), ix,
                                                                 static_cast<uint64_t*>(out.data_ptr()), n);
      break;
  }
  CheckLaunch("gather kernel");
}

Tensor OnDevice(const Tensor& t, Device device) { return t.device() == device ? t : t.to(device); }

}  // namespace

Tensor Binary(const char* op, BinaryOp code, double s, const Tensor& a, const Tensor& b, DType out_dtype) {
  const Shape out_shape = BroadcastShapes(a.sizes(), b.sizes(), op);
  const Device device = a.device().is_cuda() && (a.dim() > 0 || !b.device().is_cuda()) ? a.device() : b.device();
  const Tensor da = OnDevice(a, device), db = OnDevice(b, device);
  Tensor out = Tensor::empty(out_shape, out_dtype, device);
  const int64_t n = out.numel();
  if (n == 0) return out;
  const StridedIndexer ia = MakeIndexer(out_shape, internal::BroadcastStrides(a.sizes(), out_shape));
  const StridedIndexer ib = MakeIndexer(out_shape, internal::BroadcastStrides(b.sizes(), out_shape));
  const DType cd = internal::ComputeDType(out_dtype);
  DeviceGuard guard(device);
  const LaunchConfig c = GridFor(n);
  cudaStream_t stream = StreamOf(device);
  const void* pa = da.data_ptr();
  const void* pb = db.data_ptr();
  if (cd == DType::kFloat64) {
    BinaryKernel<double><<<c.blocks, c.threads, 0, stream>>>(code, s, pa, Elem(a.dtype()), ia, pb, Elem(b.dtype()),
                                                             ib, out.data_ptr(), Elem(out_dtype), n);
  } else if (cd == DType::kInt64) {
    BinaryKernel<int64_t><<<c.blocks, c.threads, 0, stream>>>(code, s, pa, Elem(a.dtype()), ia, pb, Elem(b.dtype()),
                                                              ib, out.data_ptr(), Elem(out_dtype), n);
  } else {
    BinaryKernel<float><<<c.blocks, c.threads, 0, stream>>>(code, s, pa, Elem(a.dtype()), ia, pb, Elem(b.dtype()),
                                                            ib, out.data_ptr(), Elem(out_dtype), n);
  }
  CheckLaunch(op);
  return out;
}

Tensor Unary(const char* op, UnaryOp code, double s, const Tensor& x, DType out_dtype) {
  Tensor out = Tensor::empty(x.sizes(), out_dtype, x.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  // int64 inputs of floating ops compute in float32 (ComputeDType(out_dtype)).
  const DType cd = internal::ComputeDType(out_dtype);
  DeviceGuard guard(x.device());
  const LaunchConfig c = GridFor(n);
  cudaStream_t stream = StreamOf(x.device());
  if (cd == DType::kFloat64) {
    UnaryKernel<double><<<c.blocks, c.threads, 0, stream>>>(code, s, x.data_ptr(), Elem(x.dtype()), out.data_ptr(),
                                                            Elem(out_dtype), n);
  } else if (cd == DType::kInt64) {
    UnaryKernel<int64_t><<<c.blocks, c.threads, 0, stream>>>(code, s, x.data_ptr(), Elem(x.dtype()),
                                                             out.data_ptr(), Elem(out_dtype), n);
  } else {
    UnaryKernel<float><<<c.blocks, c.threads, 0, stream>>>(code, s, x.data_ptr(), Elem(x.dtype()), out.data_ptr(),
                                                           Elem(out_dtype), n);
  }
  CheckLaunch(op);
  return out;
}

Tensor Expand(const Tensor& x, const Shape& shape) {
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  Gather(x, MakeIndexer(shape, internal::BroadcastStrides(x.sizes(), shape)), out);
  return out;
}

Tensor Permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Shape out_shape(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) out_shape[i] = x.sizes()[static_cast<size_t>(dims[i])];
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  Gather(x, MakeIndexer(out_shape, PermutedStrides(x.sizes(), dims)), out);
  return out;
}

Tensor Cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.sizes(), dtype, x.device());
  fsdp::internal::CudaConvertElements(x.data_ptr(), x.dtype(), out.data_ptr(), dtype, out.numel(),
                                      x.device());
  return out;
}

}  // namespace fsdp::ops::kernels::cuda

namespace fsdp::internal {

void CudaConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                         Device device) {
  using namespace fsdp::ops::kernels::cuda;  // NOLINT(google-build-using-namespace)
  if (n == 0) return;
  DeviceGuard guard(device);
  const LaunchConfig c = GridFor(n);
  CastKernel<<<c.blocks, c.threads, 0, StreamOf(device)>>>(src, Elem(src_dtype), dst,
                                                           Elem(dst_dtype), n);
  CheckLaunch("cast");
}

}  // namespace fsdp::internal
