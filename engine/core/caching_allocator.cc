#include "engine/core/caching_allocator.h"

#include <algorithm>

#include "engine/core/error.h"

namespace fsdp {

CachingAllocator::CachingAllocator(std::unique_ptr<RawDeviceMemory> raw, bool caching)
    : raw_(std::move(raw)), caching_(caching) {
  FSDP_CHECK(raw_ != nullptr, "CachingAllocator needs a raw device memory");
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const FreeKey& key : cached_) raw_->Free(key.second);
  for (const auto& [ptr, block] : live_) raw_->Free(ptr);
}

void* CachingAllocator::Allocate(size_t nbytes, StreamKey stream) {
  FSDP_CHECK(nbytes > 0, "CachingAllocator::Allocate of 0 bytes");
  const size_t size = RoundSize(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (void* hit = TakeCached(size, stream)) return hit;
  void* ptr = raw_->Malloc(size);
  if (ptr == nullptr) {
    ++stats_.num_alloc_retries;
    ReleaseCached();
    ptr = raw_->Malloc(size);
  }
  FSDP_CHECK_CODE(ErrorCode::kResourceExhausted, ptr != nullptr, raw_->DeviceName(),
                  " out of memory: tried to allocate ", size, " bytes (", nbytes,
                  " requested); ", stats_.allocated_bytes, " bytes allocated, ",
                  stats_.reserved_bytes, " bytes reserved by this process after releasing the "
                  "cache");
  ++stats_.num_raw_allocs;
  stats_.reserved_bytes += static_cast<int64_t>(size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  live_.emplace(ptr, Block{size, stream});
  OnLive(size);
  return ptr;
}

void CachingAllocator::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  FSDP_CHECK_CODE(ErrorCode::kInternal, it != live_.end(), "CachingAllocator::Free of ", ptr,
                  ", which ", raw_->DeviceName(),
                  "'s allocator did not hand out or which was already freed");
  const Block block = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= static_cast<int64_t>(block.size);
  if (caching_) {
    cached_.insert(FreeKey{{block.stream, block.size}, ptr});
  } else {
    raw_->Free(ptr);
    stats_.reserved_bytes -= static_cast<int64_t>(block.size);
    ++stats_.num_raw_frees;
  }
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCached();
}

CachingAllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CachingAllocatorStats out = stats_;
  out.num_live_blocks = static_cast<int64_t>(live_.size());
  out.num_cached_blocks = static_cast<int64_t>(cached_.size());
  return out;
}

void CachingAllocator::ResetPeakStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void* CachingAllocator::TakeCached(size_t size, StreamKey stream) {
  // Smallest block of this stream with at least `size` bytes; larger than 2 * size would waste
  // more than the request, so such a block stays cached and a new one is allocated.
  auto it = cached_.lower_bound(FreeKey{{stream, size}, nullptr});
  if (it == cached_.end() || it->first.first != stream || it->first.second >= 2 * size) {
    return nullptr;
  }
  const size_t block_size = it->first.second;
  void* ptr = it->second;
  cached_.erase(it);
  live_.emplace(ptr, Block{block_size, stream});
  ++stats_.num_cache_hits;
  OnLive(block_size);
  return ptr;
}

void CachingAllocator::ReleaseCached() {
  if (cached_.empty()) return;
  // Other streams may still use a cached block (their work was ordered before the free only
  // for reuse on the block's own stream), so the device drains before memory goes back.
  raw_->Synchronize();
  for (const FreeKey& key : cached_) {
    raw_->Free(key.second);
    stats_.reserved_bytes -= static_cast<int64_t>(key.first.second);
    ++stats_.num_raw_frees;
  }
  cached_.clear();
}

void CachingAllocator::OnLive(size_t size) {
  stats_.allocated_bytes += static_cast<int64_t>(size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
}

}  // namespace fsdp
