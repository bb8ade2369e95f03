#include "conformance/fsdp1_params.h"

#include "engine/core/error.h"

namespace fsdp::conformance {

ParamSpec ShardingStrategyAxis() {
  return ParamSpec::Axis("sharding_strategy", "FullyShardedDataParallel sharding_strategy",
                         {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"});
}

ParamSpec BackwardPrefetchAxis() {
  return ParamSpec::Axis("backward_prefetch", "BackwardPrefetch (None: no prefetch)",
                         {"BACKWARD_PRE", "BACKWARD_POST", "None"});
}

ParamSpec UseOrigParamsAxis() {
  return ParamSpec::Axis("use_orig_params", "FullyShardedDataParallel use_orig_params",
                         {"False", "True"});
}

fsdp1::ShardingStrategy ParseShardingStrategy(const std::string& name) {
  for (auto s : {fsdp1::ShardingStrategy::kFullShard, fsdp1::ShardingStrategy::kShardGradOp,
                 fsdp1::ShardingStrategy::kNoShard, fsdp1::ShardingStrategy::kHybridShard,
                 fsdp1::ShardingStrategy::kHybridShardZero2}) {
    if (name == fsdp1::ShardingStrategyName(s)) return s;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown sharding_strategy '", name, "'");
}

std::optional<fsdp1::BackwardPrefetch> ParseBackwardPrefetch(const std::string& name) {
  if (name == "BACKWARD_PRE") return fsdp1::BackwardPrefetch::kBackwardPre;
  if (name == "BACKWARD_POST") return fsdp1::BackwardPrefetch::kBackwardPost;
  FSDP_CHECK(name == "None", "unknown backward_prefetch '", name,
             "' (BACKWARD_PRE, BACKWARD_POST or None)");
  return std::nullopt;
}

}  // namespace fsdp::conformance
