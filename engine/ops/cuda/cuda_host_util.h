// Host-side helpers of the CUDA kernels (included only by *_cuda.cu / *_cuda.cc files, which
// are compiled only in builds with CUDA): error checks, the device guard and the current
// stream. Plain C++ (usable from g++-compiled *_cuda.cc files).
// Thread-safety: stateless (DeviceGuard is a scope object of one thread).
#pragma once

#include <cuda_runtime_api.h>

#include "engine/core/cuda_stream.h"
#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/ops/cuda/numerics.h"

namespace fsdp::ops::kernels::cuda {

static_assert(static_cast<int>(DType::kFloat32) == static_cast<int>(ElemType::kFloat32) &&
                  static_cast<int>(DType::kFloat64) == static_cast<int>(ElemType::kFloat64) &&
                  static_cast<int>(DType::kFloat16) == static_cast<int>(ElemType::kFloat16) &&
                  static_cast<int>(DType::kBFloat16) == static_cast<int>(ElemType::kBFloat16) &&
                  static_cast<int>(DType::kInt64) == static_cast<int>(ElemType::kInt64),
              "ElemType must mirror DType");

inline ElemType Elem(DType d) { return static_cast<ElemType>(d); }

inline void CudaCheck(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  FSDP_THROW(ErrorCode::kUnavailable, what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

// Checks the launch that was just issued (configuration errors surface here; faults inside
// the kernel surface at the next synchronising call).
inline void CheckLaunch(const char* kernel) { CudaCheck(cudaGetLastError(), kernel); }

// Makes `device` the current CUDA device of this thread for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device) {
    CudaCheck(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device.index) CudaCheck(cudaSetDevice(device.index), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

inline cudaStream_t StreamOf(Device device) { return CurrentCudaStream(device).handle; }

}  // namespace fsdp::ops::kernels::cuda
