#include "engine/core/rank_context.h"

namespace fsdp {

namespace {
thread_local RankContext* current_context = nullptr;
}  // namespace

RankContext::RankContext(int rank, int world_size, Device device, uint64_t seed)
    : rank_(rank), world_size_(world_size), device_(device), generator_(seed) {}

std::shared_ptr<MemoryStats> RankContext::memory_stats_ptr(Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& stats = memory_stats_[{static_cast<int>(device.type), device.index}];
  if (!stats) stats = std::make_shared<MemoryStats>();
  return stats;
}

RankContext& RankContext::Current() {
  if (current_context != nullptr) return *current_context;
  thread_local RankContext default_context;
  return default_context;
}

RankContextGuard::RankContextGuard(RankContext& context) : previous_(current_context) {
  current_context = &context;
}

RankContextGuard::~RankContextGuard() { current_context = previous_; }

}  // namespace fsdp
