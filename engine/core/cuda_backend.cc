// CUDA device backend on the CUDA runtime API, compiled only with CUDA; without CUDA the
// functions below report that no device exists.
#include "engine/core/allocator.h"
#include "engine/core/error.h"
#include "fsdp/config.h"

#if FSDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fsdp {

#if FSDP_HAVE_CUDA

namespace {

void CudaCheck(cudaError_t err, const char* what) {
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, err == cudaSuccess, what, " failed: ",
                  cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

// Device memory through cudaMalloc; copies are synchronous on the current stream's device.
// Thread-safety: the CUDA runtime is thread-safe; this class holds no state.
class CudaDeviceBackend final : public DeviceBackend {
 public:
  void* Allocate(size_t nbytes, int index) override {
    CudaCheck(cudaSetDevice(index), "cudaSetDevice");
    void* p = nullptr;
    CudaCheck(cudaMalloc(&p, nbytes), "cudaMalloc");
    CudaCheck(cudaMemset(p, 0, nbytes), "cudaMemset");
    return p;
  }
  void Free(void* ptr, size_t /*nbytes*/, int index) override {
    cudaSetDevice(index);
    cudaFree(ptr);
  }
  void Copy(void* dst, Device dst_device, const void* src, Device src_device,
            size_t nbytes) override {
    if (nbytes == 0) return;
    cudaMemcpyKind kind = cudaMemcpyDefault;
    if (dst_device.is_cuda()) CudaCheck(cudaSetDevice(dst_device.index), "cudaSetDevice");
    else if (src_device.is_cuda()) CudaCheck(cudaSetDevice(src_device.index), "cudaSetDevice");
    CudaCheck(cudaMemcpy(dst, src, nbytes, kind), "cudaMemcpy");
  }
  void Zero(void* ptr, size_t nbytes, int index) override {
    CudaCheck(cudaSetDevice(index), "cudaSetDevice");
    CudaCheck(cudaMemset(ptr, 0, nbytes), "cudaMemset");
  }
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "insufficient driver" error
    return 0;
  }
  return count;
}

DeviceBackend* CudaDeviceBackendOrNull() {
  static CudaDeviceBackend backend;
  return CudaDeviceCount() > 0 ? &backend : nullptr;
}

#else

int CudaDeviceCount() { return 0; }
DeviceBackend* CudaDeviceBackendOrNull() { return nullptr; }

#endif

}  // namespace fsdp
