// Memory accounting and device backends.
//
// MemoryStats counts current and peak bytes of one (rank, device) pair; every Storage charges
// the stats of the rank that allocated it and credits the same object when it frees, even if
// the free happens on another thread. Counters are atomic: thread-safe.
//
// DeviceBackend is the per-device-type set of primitives the core needs (allocate, free,
// copy, zero). The CPU backend is always present; the CUDA backend exists when the project was
// built with CUDA and a device is visible at run time (otherwise Unavailable is thrown).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "engine/core/device.h"

namespace fsdp {

class MemoryStats {
 public:
  void OnAllocate(int64_t bytes);
  void OnFree(int64_t bytes);
  int64_t current_bytes() const { return current_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }
  int64_t num_allocations() const { return num_allocs_.load(); }
  // Sets the peak to the current value (torch.cuda.reset_peak_memory_stats).
  void ResetPeak() { peak_.store(current_.load()); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_allocs_{0};
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // Returns uninitialised memory of `nbytes` (> 0) on device `index` (Storage zero-fills it
  // unless asked not to, engine/core/storage.h AllocInit).
  virtual void* Allocate(size_t nbytes, int index) = 0;
  virtual void Free(void* ptr, size_t nbytes, int index) = 0;
  // Copies `nbytes` between any two devices of which at least one is of this backend's type.
  // A host<->device copy returns before it finished only with `non_blocking`, which the caller
  // passes only when the host buffer is pinned (PyTorch's rule: non_blocking from pageable
  // memory is synchronous); the caller then orders later host use with an event.
  virtual void Copy(void* dst, Device dst_device, const void* src, Device src_device,
                    size_t nbytes, bool non_blocking) = 0;
  // Sets `nbytes` bytes at `ptr` to `byte` (memset).
  virtual void Fill(void* ptr, unsigned char byte, size_t nbytes, int index) = 0;
  void Zero(void* ptr, size_t nbytes, int index) { Fill(ptr, 0, nbytes, index); }
};

// Page-locked host memory (cudaHostAlloc), uninitialised, for Tensor::pin_memory and FSDP's CPU
// offload with pin_memory. Throws Unavailable when no CUDA device is visible (PyTorch: "Cannot
// access accelerator device when none is available"). Freeing waits for the device
// (cudaFreeHost), so an in-flight non-blocking copy never reads freed memory.
void* AllocatePinnedHost(size_t nbytes);
void FreePinnedHost(void* ptr);

// The backend for `type`. Throws Unavailable for CUDA when not built or no device is visible.
DeviceBackend& GetDeviceBackend(DeviceType type);
// Number of CUDA devices visible (0 when built without CUDA or when no driver is present).
int CudaDeviceCount();

struct CachingAllocatorStats;  // engine/core/caching_allocator.h
// The statistics of cuda:index's caching allocator (torch.cuda.memory_stats): all zero without
// a device; with PYTORCH_NO_CUDA_MEMORY_CACHING=1 nothing is cached (no hits).
CachingAllocatorStats CudaCachingAllocatorStats(int index);
// Releases every cached free block of every device (torch.cuda.empty_cache).
void CudaEmptyCache();

}  // namespace fsdp
