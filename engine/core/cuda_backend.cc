// CUDA device backend on the CUDA runtime API, compiled only with CUDA; without CUDA the
// functions below report that no device exists.
#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
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

// Device memory through cudaMalloc. Zero-filling and copies are issued on the calling thread's
// current stream of the device (engine/core/cuda_stream.h), so they are ordered with the
// kernels launched there; copies that touch host memory wait for that stream before returning
// (the host buffer is pageable and the caller reads it next). A device-to-device copy between
// two devices first waits for the source device's current stream.
// Thread-safety: the CUDA runtime is thread-safe; this class holds no state.
class CudaDeviceBackend final : public DeviceBackend {
 public:
  void* Allocate(size_t nbytes, int index) override {
    CudaCheck(cudaSetDevice(index), "cudaSetDevice");
    void* p = nullptr;
    CudaCheck(cudaMalloc(&p, nbytes), "cudaMalloc");
    CudaCheck(cudaMemsetAsync(p, 0, nbytes, Stream(index)), "cudaMemsetAsync");
    return p;
  }
  void Free(void* ptr, size_t /*nbytes*/, int index) override {
    // cudaFree waits for the device's outstanding work that may still use the buffer.
    cudaSetDevice(index);
    cudaFree(ptr);
  }
  void Copy(void* dst, Device dst_device, const void* src, Device src_device,
            size_t nbytes) override {
    if (nbytes == 0) return;
    const Device on = dst_device.is_cuda() ? dst_device : src_device;
    CudaCheck(cudaSetDevice(on.index), "cudaSetDevice");
    if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
      CudaCheck(cudaStreamSynchronize(Stream(src_device.index)), "cudaStreamSynchronize");
    }
    cudaStream_t stream = Stream(on.index);
    CudaCheck(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
    if (!dst_device.is_cuda() || !src_device.is_cuda() || dst_device != src_device) {
      CudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
  }
  void Zero(void* ptr, size_t nbytes, int index) override {
    CudaCheck(cudaSetDevice(index), "cudaSetDevice");
    CudaCheck(cudaMemsetAsync(ptr, 0, nbytes, Stream(index)), "cudaMemsetAsync");
  }

 private:
  static cudaStream_t Stream(int index) { return CurrentCudaStream(Device::CUDA(index)).handle; }
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
