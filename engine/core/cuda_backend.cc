// CUDA device backend on the CUDA runtime API and the caching allocator, compiled only with
// CUDA; without CUDA the functions below report that no device exists.
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/core/allocator.h"
#include "engine/core/caching_allocator.h"
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

// cudaMalloc/cudaFree of one device, the raw memory under the caching allocator.
// Thread-safety: stateless apart from the device index.
class CudaRawMemory final : public RawDeviceMemory {
 public:
  explicit CudaRawMemory(int index) : index_(index) {}
  void* Malloc(size_t nbytes) override {
    CudaCheck(cudaSetDevice(index_), "cudaSetDevice");
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: the caller releases its cache and retries
      return nullptr;
    }
    CudaCheck(err, "cudaMalloc");
    return p;
  }
  void Free(void* ptr) override {
    // cudaFree waits for the device's outstanding work that may still use the buffer.
    cudaSetDevice(index_);
    cudaFree(ptr);
  }
  void Synchronize() override {
    CudaCheck(cudaSetDevice(index_), "cudaSetDevice");
    CudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::string DeviceName() const override { return Device::CUDA(index_).str(); }

 private:
  int index_;
};

// PyTorch's switch for debugging with the raw allocator: PYTORCH_NO_CUDA_MEMORY_CACHING=1.
bool CachingDisabled() {
  const char* v = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
  return v != nullptr && std::string(v) == "1";
}

// Device memory through one CachingAllocator per device (engine/core/caching_allocator.h):
// a block is reused by later allocations on the stream that was current when it was first
// allocated, without synchronising; FSDP orders cross-stream use with events. With
// PYTORCH_NO_CUDA_MEMORY_CACHING=1 the allocators cache nothing (every free is a cudaFree).
// Fills (Zero) and copies are issued on the calling thread's current stream of the device
// (engine/core/cuda_stream.h), so they are ordered with the kernels launched there; copies that
// touch host memory wait for that stream before returning (the host buffer is pageable and the
// caller reads it next) unless the caller asked for non_blocking on pinned memory. A
// device-to-device copy between two devices first waits for the source device's current
// stream.
// Thread-safety: the CUDA runtime and the caching allocators are thread-safe; the allocators
// are created once, under a mutex.
class CudaDeviceBackend final : public DeviceBackend {
 public:
  void* Allocate(size_t nbytes, int index) override {
    CudaCheck(cudaSetDevice(index), "cudaSetDevice");
    return Cache(index).Allocate(nbytes, Stream(index));
  }
  void Free(void* ptr, size_t /*nbytes*/, int index) override { Cache(index).Free(ptr); }
  void Copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
            bool non_blocking) override {
    if (nbytes == 0) return;
    const Device on = dst_device.is_cuda() ? dst_device : src_device;
    CudaCheck(cudaSetDevice(on.index), "cudaSetDevice");
    if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
      CudaCheck(cudaStreamSynchronize(Stream(src_device.index)), "cudaStreamSynchronize");
    }
    cudaStream_t stream = Stream(on.index);
    CudaCheck(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
    const bool host_side = !dst_device.is_cuda() || !src_device.is_cuda();
    if ((host_side && !non_blocking) || (!host_side && dst_device != src_device)) {
      CudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
  }
  void Fill(void* ptr, unsigned char byte, size_t nbytes, int index) override {
    CudaCheck(cudaSetDevice(index), "cudaSetDevice");
    CudaCheck(cudaMemsetAsync(ptr, byte, nbytes, Stream(index)), "cudaMemsetAsync");
  }

  // The allocator of device `index` (created on first use).
  CachingAllocator& Cache(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<CachingAllocator>& cache = caches_[index];
    if (cache == nullptr) {
      cache = std::make_unique<CachingAllocator>(std::make_unique<CudaRawMemory>(index),
                                                 /*caching=*/!CachingDisabled());
    }
    return *cache;
  }

 private:
  static cudaStream_t Stream(int index) { return CurrentCudaStream(Device::CUDA(index)).handle; }

  std::mutex mu_;
  std::map<int, std::unique_ptr<CachingAllocator>> caches_;
};

CudaDeviceBackend& Backend() {
  // Never destroyed: storages of static tensors may be freed during static destruction.
  static auto* backend = new CudaDeviceBackend();
  return *backend;
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "insufficient driver" error
    return 0;
  }
  return count;
}

DeviceBackend* CudaDeviceBackendOrNull() { return CudaDeviceCount() > 0 ? &Backend() : nullptr; }

CachingAllocatorStats CudaCachingAllocatorStats(int index) {
  if (CudaDeviceCount() == 0) return {};
  return Backend().Cache(index).stats();
}

void* AllocatePinnedHost(size_t nbytes) {
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, CudaDeviceCount() > 0,
                  "pin_memory: cannot access accelerator device when none is available (",
                  CudaDeviceCount(), " CUDA devices visible)");
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, nbytes, cudaHostAllocDefault);
  FSDP_CHECK_CODE(ErrorCode::kResourceExhausted, err != cudaErrorMemoryAllocation,
                  "pin_memory: out of page-locked host memory allocating ", nbytes, " bytes");
  CudaCheck(err, "cudaHostAlloc");
  return p;
}

void FreePinnedHost(void* ptr) { cudaFreeHost(ptr); }

void CudaEmptyCache() {
  for (int i = 0, n = CudaDeviceCount(); i < n; ++i) {
    Backend().Cache(i).EmptyCache();
  }
}

#else

int CudaDeviceCount() { return 0; }
DeviceBackend* CudaDeviceBackendOrNull() { return nullptr; }
CachingAllocatorStats CudaCachingAllocatorStats(int /*index*/) { return {}; }
void CudaEmptyCache() {}
void* AllocatePinnedHost(size_t nbytes) {
  FSDP_THROW(ErrorCode::kUnavailable, "pin_memory of ", nbytes,
             " bytes: cannot access accelerator device when none is available (this build has "
             "no CUDA)");
}
void FreePinnedHost(void* /*ptr*/) {}

#endif

}  // namespace fsdp
