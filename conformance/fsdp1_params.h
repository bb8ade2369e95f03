// The FullyShardedDataParallel knobs that FSDP1 scenario families share as parameters:
// the sharding_strategy, backward_prefetch, use_orig_params and mixed_precision axes, their
// parsing into the engine's option types, and the 2-D mesh a hybrid strategy runs on.
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "conformance/params.h"
#include "engine/fsdp1/api.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"

namespace fsdp::conformance {

// {FULL_SHARD, SHARD_GRAD_OP, NO_SHARD}: the seeds' strategies (hybrid ones need a 2-D mesh).
ParamSpec ShardingStrategyAxis();
// Every ShardingStrategy, the hybrid ones included (they need HybridMeshShape(world)).
ParamSpec AllShardingStrategiesAxis();
// {BACKWARD_PRE, BACKWARD_POST, None}.
ParamSpec BackwardPrefetchAxis();
// {False, True}.
ParamSpec UseOrigParamsAxis();

// {None, bfloat16, float16, reduce_bfloat16}: no MixedPrecision; MixedPrecision(param_dtype,
// reduce_dtype, buffer_dtype) all bfloat16 / all float16; MixedPrecision(reduce_dtype=bfloat16)
// only. Also accepts, when fixed, param_bfloat16: MixedPrecision(param_dtype=bfloat16) only.
ParamSpec MixedPrecisionAxis();
// A MixedPrecisionAxis value as the engine's MixedPrecision; InvalidArgument otherwise.
fsdp1::MixedPrecision ParseMixedPrecision(const std::string& name);
// The dtype FSDP1 reduces gradients in under `mp` for parameters of `param_dtype`.
DType Fsdp1ReduceDType(const fsdp1::MixedPrecision& mp, DType param_dtype);

// The (replicate, shard) mesh shape a hybrid strategy uses at `world` ranks: replicate = the
// smallest prime factor of `world`, shard = the rest; nullopt when either would be 1 (a world
// of 1, or a prime world), which cannot shard within and replicate across groups at once.
struct HybridMeshShape {
  int64_t replicate = 0;
  int64_t shard = 0;
};
std::optional<HybridMeshShape> HybridMeshShapeFor(int world);

// "FULL_SHARD" etc.; InvalidArgument naming the value otherwise.
fsdp1::ShardingStrategy ParseShardingStrategy(const std::string& name);
// "BACKWARD_PRE", "BACKWARD_POST", or "None" (no prefetch); InvalidArgument otherwise.
std::optional<fsdp1::BackwardPrefetch> ParseBackwardPrefetch(const std::string& name);

// FullyShardedDataParallel over `pg` with the case's sharding_strategy, backward_prefetch and
// use_orig_params, and its forward_prefetch where the scenario declares one (a
// non-hybrid strategy; the rest of the options at their defaults).
fsdp1::FullyShardedDataParallelOptions Fsdp1CaseOptions(
    const CaseParams& params, std::shared_ptr<distributed::ProcessGroup> pg);

// FSDP1's strategy rules as the judges state them, never through the engine's fsdp1::
// IsHybridStrategy / ReshardsAfterForward, so that a wrong rule in the engine cannot move an
// expectation with it: the hybrid strategies (HYBRID_SHARD, _HYBRID_SHARD_ZERO2) shard within
// the shard group and all-reduce across replicas; FULL_SHARD and HYBRID_SHARD free the
// unsharded flat parameter after forward (the others keep it until backward).
bool Fsdp1HybridRule(fsdp1::ShardingStrategy strategy);
bool Fsdp1ReshardsAfterForwardRule(fsdp1::ShardingStrategy strategy);

// FSDP1 all-gathers a flat parameter with all_gather_into_tensor (`c10d._allgather_base_`) on
// an accelerator and with the list all_gather (`c10d.allgather_`) on the CPU: judges count both
// under kFlatParamAllGather.
inline constexpr const char* kFlatParamAllGather = "c10d._allgather_base_";
inline constexpr const char* kFlatParamAllGatherList = "c10d.allgather_";
// One phase's {op: n} counts with both all-gather keys merged under kFlatParamAllGather.
nlohmann::json MergeFlatParamAllGathers(nlohmann::json phase);

}  // namespace fsdp::conformance
