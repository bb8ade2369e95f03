// The FullyShardedDataParallel knobs that FSDP1 scenario families share as parameters:
// the sharding_strategy, backward_prefetch and use_orig_params axes with the seeds' values,
// and their parsing into the engine's option types. Stateless; thread-safe.
#pragma once

#include <optional>
#include <string>

#include "conformance/params.h"
#include "engine/fsdp1/api.h"

namespace fsdp::conformance {

// {FULL_SHARD, SHARD_GRAD_OP, NO_SHARD}: the seeds' strategies (hybrid ones need a 2-D mesh).
ParamSpec ShardingStrategyAxis();
// {BACKWARD_PRE, BACKWARD_POST, None}.
ParamSpec BackwardPrefetchAxis();
// {False, True}.
ParamSpec UseOrigParamsAxis();

// "FULL_SHARD" etc.; InvalidArgument naming the value otherwise.
fsdp1::ShardingStrategy ParseShardingStrategy(const std::string& name);
// "BACKWARD_PRE", "BACKWARD_POST", or "None" (no prefetch); InvalidArgument otherwise.
std::optional<fsdp1::BackwardPrefetch> ParseBackwardPrefetch(const std::string& name);

}  // namespace fsdp::conformance
