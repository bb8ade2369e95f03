// A stream-ordered caching allocator for device memory (PyTorch's CUDACachingAllocator, reduced
// to what this engine needs), independent of the CUDA runtime so that its policy is tested on
// any machine: the raw memory comes through RawDeviceMemory (cudaMalloc/cudaFree in
// engine/core/cuda_backend.cc, a counting fake in the tests).
//
// Semantics (the same contract as PyTorch's allocator without record_stream):
// - Every block belongs to the stream that was current when it was allocated (`StreamKey`, the
//   runtime's opaque stream handle; the legacy default stream is nullptr).
// - Free() returns the block to its stream's pool at once, without synchronising: the next
//   allocation on the same stream may reuse it, which is safe in that stream's order. Work on
//   *other* streams that still reads or writes the block must have been ordered before the free
//   by events; that is the caller's job, and FSDP's event-managed buffer lifetimes
//   (docs/fsdp-behaviour.md, "Streams and the implicit forward prefetch": all_gather_state,
//   reduce_scatter_state, post_reduce_event) exist to do it. A block is never handed to another stream.
// - Allocate() rounds the size up to kRoundBytes, then takes the smallest free block of the
//   stream that fits and is less than twice the rounded size (no block splitting), otherwise
//   asks the raw memory for a new one. When that fails, it waits for the device, releases every
//   cached free block (of all streams) and tries once more; if that fails too it throws
//   ResourceExhausted naming the request, the device and the allocated/reserved bytes.
// - EmptyCache() waits for the device and releases every free block (torch.cuda.empty_cache).
// - Constructed with caching off (PYTORCH_NO_CUDA_MEMORY_CACHING=1), every Free returns the block
//   to the raw memory at once (cudaFree waits for the device) and nothing is cached; sizes,
//   errors and statistics stay the same.
//
// Statistics (torch.cuda.memory_stats vocabulary): allocated bytes (rounded sizes of live
// blocks), reserved bytes (all blocks held from the raw memory), their peaks, and the counts of
// raw allocations/frees, cache hits and out-of-memory retries. The per-rank MemoryStats of
// engine/core/allocator.h keep counting the bytes each tensor storage asked for, as on the CPU.
//
// Ownership: owns the raw memory object and every block obtained from it; the destructor returns
// all blocks (live ones too) to the raw memory.
// Thread-safety: all methods are thread-safe (one mutex); ranks are threads and free each
// other's buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

namespace fsdp {

// Raw memory of one device: what the cache obtains blocks from and returns them to.
// Thread-safety: called under the CachingAllocator's mutex only.
class RawDeviceMemory {
 public:
  virtual ~RawDeviceMemory() = default;
  // Returns nbytes of device memory, or nullptr when the device is out of memory.
  virtual void* Malloc(size_t nbytes) = 0;
  virtual void Free(void* ptr) = 0;
  // Waits until all work queued on the device has finished (before cached blocks that other
  // streams might still use are released).
  virtual void Synchronize() = 0;
  // The device's name for error messages ("cuda:0").
  virtual std::string DeviceName() const = 0;
};

struct CachingAllocatorStats {
  int64_t allocated_bytes = 0;       // rounded bytes of live blocks
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;        // bytes held from the raw memory (live + cached)
  int64_t peak_reserved_bytes = 0;
  int64_t num_raw_allocs = 0;        // successful RawDeviceMemory::Malloc calls
  int64_t num_raw_frees = 0;
  int64_t num_cache_hits = 0;        // allocations served from the cache
  int64_t num_alloc_retries = 0;     // raw allocations that failed and were retried
  int64_t num_live_blocks = 0;
  int64_t num_cached_blocks = 0;
};

class CachingAllocator {
 public:
  using StreamKey = const void*;
  static constexpr size_t kRoundBytes = 512;

  explicit CachingAllocator(std::unique_ptr<RawDeviceMemory> raw, bool caching = true);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least nbytes (> 0) for `stream`. Contents are unspecified.
  void* Allocate(size_t nbytes, StreamKey stream);
  // Returns a pointer obtained from Allocate to its stream's pool. Throws Internal for a
  // pointer this allocator does not own (or already freed).
  void Free(void* ptr);
  void EmptyCache();
  CachingAllocatorStats stats() const;
  void ResetPeakStats();

  static size_t RoundSize(size_t nbytes) { return (nbytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes; }

 private:
  struct Block {
    size_t size = 0;
    StreamKey stream = nullptr;
  };
  // Free blocks ordered by (stream, size, address) so that best fit is one lower_bound.
  using FreeKey = std::pair<std::pair<StreamKey, size_t>, void*>;

  void* TakeCached(size_t size, StreamKey stream);  // nullptr on a miss; mutex held
  void ReleaseCached();                              // mutex held
  void OnLive(size_t size);                          // mutex held

  std::unique_ptr<RawDeviceMemory> raw_;
  const bool caching_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::set<FreeKey> cached_;
  CachingAllocatorStats stats_;
};

}  // namespace fsdp
