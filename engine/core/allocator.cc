#include "engine/core/allocator.h"

#include <cstdlib>
#include <cstring>

#include "engine/core/error.h"

namespace fsdp {

void MemoryStats::OnAllocate(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes) + bytes;
  num_allocs_.fetch_add(1);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void MemoryStats::OnFree(int64_t bytes) { current_.fetch_sub(bytes); }

namespace {

// CPU memory: 64-byte aligned (the size rounded up to 64 bytes), uninitialised.
class CpuDeviceBackend final : public DeviceBackend {
 public:
  void* Allocate(size_t nbytes, int /*index*/) override {
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    FSDP_CHECK_CODE(ErrorCode::kUnavailable, p != nullptr, "CPU allocation of ", nbytes,
                    " bytes failed");
    return p;
  }
  void Free(void* ptr, size_t /*nbytes*/, int /*index*/) override { std::free(ptr); }
  void Copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
            bool non_blocking) override {
    if (dst_device.is_cuda() || src_device.is_cuda()) {
      GetDeviceBackend(DeviceType::kCUDA)
          .Copy(dst, dst_device, src, src_device, nbytes, non_blocking);
      return;
    }
    if (nbytes > 0 && dst != src) std::memmove(dst, src, nbytes);
  }
  void Fill(void* ptr, unsigned char byte, size_t nbytes, int /*index*/) override {
    if (nbytes > 0) std::memset(ptr, byte, nbytes);
  }
};

}  // namespace

// Defined in engine/core/cuda_backend.cc (nullptr when no CUDA device can be used).
DeviceBackend* CudaDeviceBackendOrNull();

DeviceBackend& GetDeviceBackend(DeviceType type) {
  static CpuDeviceBackend cpu;
  if (type == DeviceType::kCPU) return cpu;
  DeviceBackend* cuda = CudaDeviceBackendOrNull();
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, cuda != nullptr,
                  "no CUDA device is available (", CudaDeviceCount(),
                  " visible); the CUDA backend needs a build with nvcc and a GPU with a driver");
  return *cuda;
}

}  // namespace fsdp
