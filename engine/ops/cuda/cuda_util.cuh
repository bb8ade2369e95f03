// Device-side helpers of the CUDA kernels (included only by *_cuda.cu files): element
// loads/stores by runtime dtype, typed math, warp reductions, grid-stride loops; plus the host
// helpers of cuda_host_util.h.
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/ops/cuda/cuda_host_util.h"
#include "engine/ops/cuda/launch_plan.h"
#include "engine/ops/cuda/numerics.h"

namespace fsdp::ops::kernels::cuda {

// ---- Typed element access ------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ T Load(const void* p, ElemType t, int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return LoadFloat(p, t, i);
  } else if constexpr (std::is_same_v<T, double>) {
    return LoadDouble(p, t, i);
  } else {
    return static_cast<const int64_t*>(p)[i];  // int64 compute: inputs are int64
  }
}

template <typename T>
__device__ __forceinline__ void Store(void* p, ElemType t, int64_t i, T v) {
  if constexpr (std::is_same_v<T, float>) {
    StoreFloat(p, t, i, v);
  } else if constexpr (std::is_same_v<T, double>) {
    StoreDouble(p, t, i, v);
  } else {
    static_cast<int64_t*>(p)[i] = v;
  }
}

// ---- Math on the compute type ----------------------------------------------------------------

__device__ __forceinline__ float Exp(float x) { return expf(x); }
__device__ __forceinline__ double Exp(double x) { return exp(x); }
__device__ __forceinline__ float Log(float x) { return logf(x); }
__device__ __forceinline__ double Log(double x) { return log(x); }
__device__ __forceinline__ float Sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double Sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float Pow(float x, float e) { return powf(x, e); }
__device__ __forceinline__ double Pow(double x, double e) { return pow(x, e); }
__device__ __forceinline__ float Erf(float x) { return erff(x); }
__device__ __forceinline__ double Erf(double x) { return erf(x); }
__device__ __forceinline__ float Tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double Tanh(double x) { return tanh(x); }
__device__ __forceinline__ bool IsNan(float x) { return isnan(x); }
__device__ __forceinline__ bool IsNan(double x) { return isnan(x); }
template <typename T>
__device__ __forceinline__ T Infinity() {
  if constexpr (std::is_same_v<T, float>) {
    return __int_as_float(0x7f800000);
  } else {
    return __longlong_as_double(0x7ff0000000000000LL);
  }
}

// ---- Warp reductions (fixed shuffle order: deterministic) -----------------------------------

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const T o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = o > v ? o : v;
  }
  return v;
}

// Global warp index and lane for one-warp-per-row kernels.
__device__ __forceinline__ int64_t GlobalWarp() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
}
__device__ __forceinline__ int64_t WarpCount() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
}
__device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x % kWarpSize); }

#define FSDP_GRID_STRIDE_LOOP(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);      \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Calls fn(float{}) or fn(double{}) for a floating compute dtype.
template <typename Fn>
decltype(auto) DispatchFloatCompute(DType cd, const char* op, Fn&& fn) {
  if (cd == DType::kFloat64) return fn(double{});
  FSDP_INTERNAL_ASSERT(cd == DType::kFloat32, op, ": unexpected compute dtype ", DTypeName(cd));
  return fn(float{});
}

}  // namespace fsdp::ops::kernels::cuda
