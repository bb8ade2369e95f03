#include "engine/core/storage.h"

#include "engine/core/error.h"
#include "engine/core/rank_context.h"

namespace fsdp {

Storage::Storage(size_t nbytes, Device device, bool pinned) : device_(device), pinned_(pinned) {
  FSDP_CHECK(!pinned || device.is_cpu(), "only CPU memory can be pinned, not ", device.str());
  Allocate(nbytes);
}

Storage::~Storage() { Release(); }

void Storage::Resize(size_t nbytes) {
  if (nbytes == nbytes_) return;
  Release();
  Allocate(nbytes);
}

void Storage::Allocate(size_t nbytes) {
  if (nbytes == 0) return;
  data_ = pinned_ ? AllocatePinnedHost(nbytes)
                  : GetDeviceBackend(device_.type).Allocate(nbytes, device_.index);
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
