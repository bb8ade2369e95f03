// The option types of FullyShardedDataParallel (FSDP1; PyTorch's torch/distributed/fsdp/api.py):
// ShardingStrategy, BackwardPrefetch, CPUOffload, MixedPrecision, and the names FSDP1 gives to
// its wrapper and flat parameter (`_fsdp_wrapped_module`, `_flat_param`) with
// clean_tensor_name. See docs/fsdp1.md. Value types; thread-safe.
#pragma once

#include <optional>
#include <string>

#include "engine/core/dtype.h"

namespace fsdp::fsdp1 {

// Declaration order as in PyTorch. FULL_SHARD and HYBRID_SHARD reshard after forward (except
// the root instance); SHARD_GRAD_OP and _HYBRID_SHARD_ZERO2 keep the unsharded parameters
// until post-backward; NO_SHARD never shards (gradients are all-reduced). The hybrid strategies
// shard within a shard group and all-reduce gradients across a replicate group.
enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard, kHybridShardZero2 };

// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2".
const char* ShardingStrategyName(ShardingStrategy strategy);
// Every strategy but NO_SHARD shards the flat parameter (`uses_sharded_strategy`).
bool UsesShardedStrategy(ShardingStrategy strategy);
// FULL_SHARD and HYBRID_SHARD (`RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES`).
bool ReshardsAfterForward(ShardingStrategy strategy);
// HYBRID_SHARD and _HYBRID_SHARD_ZERO2 (`HYBRID_SHARDING_STRATEGIES`).
bool IsHybridStrategy(ShardingStrategy strategy);

// BackwardPrefetch.BACKWARD_PRE / BACKWARD_POST; "no prefetch" is an empty optional
// (`backward_prefetch=None`).
enum class BackwardPrefetch { kBackwardPre, kBackwardPost };
// "BACKWARD_PRE", "BACKWARD_POST"; "None" for an empty optional.
std::string BackwardPrefetchName(const std::optional<BackwardPrefetch>& prefetch);

// CPUOffload(offload_params): the sharded flat parameters and their gradients live on the
// CPU; the optimizer steps there.
struct CPUOffload {
  bool offload_params = false;  // Default: false
};

// MixedPrecision(param_dtype, reduce_dtype, buffer_dtype, keep_low_precision_grads,
// cast_forward_inputs, cast_root_forward_inputs).
struct MixedPrecision {
  // Dtype of the unsharded flat parameter (forward and backward compute). Default: unset.
  std::optional<DType> param_dtype;
  // Dtype of the gradient reduction. Default: unset, which means param_dtype when that is set
  // (FSDP1 infers it), else the parameter dtype.
  std::optional<DType> reduce_dtype;
  // Floating-point buffers are cast to it at lazy init. Default: unset.
  std::optional<DType> buffer_dtype;
  // Keep the reduced gradients in param_dtype instead of casting them back. Default: false.
  bool keep_low_precision_grads = false;
  // Cast floating-point forward inputs to param_dtype in every instance's forward. Default:
  // false.
  bool cast_forward_inputs = false;
  // Cast floating-point forward inputs to param_dtype in the root's forward. Default: true.
  bool cast_root_forward_inputs = true;
};

// FSDP_WRAPPED_MODULE, FSDP_PREFIX and FLAT_PARAM of PyTorch's _common_utils / _flat_param.
inline constexpr const char* kFsdpWrappedModule = "_fsdp_wrapped_module";
inline constexpr const char* kFsdpPrefix = "_fsdp_wrapped_module.";
inline constexpr const char* kFlatParam = "_flat_param";

// clean_tensor_name: removes every "_fsdp_wrapped_module." and "_checkpoint_wrapped_module."
// from an FQN ("layer._fsdp_wrapped_module.weight" -> "layer.weight").
std::string CleanTensorName(const std::string& name);

}  // namespace fsdp::fsdp1
