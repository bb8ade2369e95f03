#include "engine/fsdp1/api.h"

#include "engine/nn/checkpoint.h"

namespace fsdp::fsdp1 {

const char* ShardingStrategyName(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
    case ShardingStrategy::kHybridShardZero2: return "_HYBRID_SHARD_ZERO2";
  }
  return "?";
}

bool UsesShardedStrategy(ShardingStrategy strategy) {
  return strategy != ShardingStrategy::kNoShard;
}

bool ReshardsAfterForward(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kFullShard || strategy == ShardingStrategy::kHybridShard;
}

bool IsHybridStrategy(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kHybridShard ||
         strategy == ShardingStrategy::kHybridShardZero2;
}

std::string BackwardPrefetchName(const std::optional<BackwardPrefetch>& prefetch) {
  if (!prefetch) return "None";
  return *prefetch == BackwardPrefetch::kBackwardPre ? "BACKWARD_PRE" : "BACKWARD_POST";
}

std::string CleanTensorName(const std::string& name) {
  std::string out = name;
  for (const std::string prefix : {std::string(kFsdpPrefix), std::string(nn::kCheckpointPrefix)}) {
    for (size_t pos = out.find(prefix); pos != std::string::npos; pos = out.find(prefix, pos)) {
      out.erase(pos, prefix.size());
    }
  }
  return out;
}

}  // namespace fsdp::fsdp1
