// Storage: a device buffer that tensors view into. It can be freed (Resize(0)) and allocated
// again (Resize(n)) without invalidating the tensors that view it, which is how FSDP frees and
// re-materialises unsharded parameters (PyTorch's untyped_storage().resize_()). Allocations are
// zero-filled ([Note: allocations are zero-filled] in docs/decisions.md) unless the caller asks
// for AllocInit::kUninitialized, and are charged to the MemoryStats of the rank current at
// allocation time. A CPU storage may be
// pinned (page-locked, engine/core/allocator.h AllocatePinnedHost), which lets host<->device
// copies run asynchronously; it stays pinned across Resize.
// Ownership: shared by every tensor that views it (std::shared_ptr).
// Thread-safety: not synchronised; one rank uses a storage at a time (collectives hand buffers
// between ranks only under the process group's synchronisation).
#pragma once

#include <cstddef>
#include <memory>

#include "engine/core/allocator.h"
#include "engine/core/device.h"

namespace fsdp {

// What a new allocation holds. kZeros: zero-filled, the default. kUninitialized: whatever the
// allocator returns (torch.empty's and resize_'s contract), only for a caller that overwrites
// every byte before anything reads it (FSDP's all-gather outputs and reduce-scatter buffers).
enum class AllocInit { kZeros, kUninitialized };

// torch.utils.deterministic.fill_uninitialized_memory for this engine: when the environment
// has FSDP_FILL_UNINITIALIZED_MEMORY=1 (read once), every kUninitialized allocation is filled
// with 0xFF bytes (NaN in every floating-point dtype, -1 in the integer ones), so that a read
// of memory its caller failed to overwrite shows in results instead of reading stale zeros.
bool FillUninitializedMemory();

class Storage {
 public:
  // Throws InvalidArgument for a pinned non-CPU storage, Unavailable when pinning is impossible.
  Storage(size_t nbytes, Device device, bool pinned = false, AllocInit init = AllocInit::kZeros);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }
  // Frees the buffer when nbytes is 0; otherwise frees and allocates nbytes of memory as `init`
  // says (contents are not preserved, as with resize_ in FSDP's free/alloc pattern). A no-op
  // when the size is unchanged.
  void Resize(size_t nbytes, AllocInit init = AllocInit::kZeros);

 private:
  void Allocate(size_t nbytes, AllocInit init);
  void Release();

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool pinned_ = false;
  std::shared_ptr<MemoryStats> stats_;
};

}  // namespace fsdp
