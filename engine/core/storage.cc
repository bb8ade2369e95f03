#include "engine/core/storage.h"

#include <cstdlib>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/rank_context.h"

namespace fsdp {

bool FillUninitializedMemory() {
  static const bool fill = [] {
    const char* v = std::getenv("FSDP_FILL_UNINITIALIZED_MEMORY");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return fill;
}

Storage::Storage(size_t nbytes, Device device, bool pinned, AllocInit init)
    : device_(device), pinned_(pinned) {
  FSDP_CHECK(!pinned || device.is_cpu(), "only CPU memory can be pinned, not ", device.str());
  Allocate(nbytes, init);
}

Storage::~Storage() { Release(); }

void Storage::Resize(size_t nbytes, AllocInit init) {
  if (nbytes == nbytes_) return;
  Release();
  Allocate(nbytes, init);
}

void Storage::Allocate(size_t nbytes, AllocInit init) {
  if (nbytes == 0) return;
  DeviceBackend& backend = GetDeviceBackend(device_.type);  // the CPU's for pinned memory
  data_ = pinned_ ? AllocatePinnedHost(nbytes) : backend.Allocate(nbytes, device_.index);
  if (init == AllocInit::kZeros) {
    backend.Zero(data_, nbytes, device_.index);
  } else if (FillUninitializedMemory()) {
    backend.Fill(data_, 0xFF, nbytes, device_.index);
  }
  nbytes_ = nbytes;
  stats_ = RankContext::Current().memory_stats_ptr(device_);
  stats_->OnAllocate(static_cast<int64_t>(nbytes));
}

void Storage::Release() {
  if (data_ == nullptr) return;
  if (pinned_) {
    FreePinnedHost(data_);
  } else {
    GetDeviceBackend(device_.type).Free(data_, nbytes_, device_.index);
  }
  stats_->OnFree(static_cast<int64_t>(nbytes_));
  data_ = nullptr;
  nbytes_ = 0;
  stats_.reset();
}

}  // namespace fsdp
