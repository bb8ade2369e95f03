// TrainingState and ShardedState: the two state machines of FSDP2 (docs/fsdp-behaviour.md,
// "State machines";
// PyTorch's _fsdp_common.TrainingState and _fsdp_param.ShardedState), with PyTorch's spelling
// of each value ("FORWARD", "SHARDED_POST_FORWARD", ...) for events and error messages.
// Value types; thread-safe. See docs/fsdp.md, [Note: FSDP state machines].
#pragma once

#include <cstdint>

namespace fsdp::fsdp2 {

// Declaration order as in PyTorch.
enum class TrainingState : uint8_t {
  kForward,       // in a module's forward (between its pre-forward and post-forward hooks)
  kPreBackward,   // the module's pre-backward ran; its gradients are being computed
  kPostBackward,  // the group's post-backward ran (groups only; a state never enters it)
  kIdle,          // outside forward and backward
};

// "FORWARD", "PRE_BACKWARD", "POST_BACKWARD", "IDLE".
const char* TrainingStateName(TrainingState state);

enum class ShardedState : uint8_t {
  kSharded,             // the sharded parameter is registered; only sharded data is allocated
  kShardedPostForward,  // the post-forward shard (int reshard_after_forward) is registered
  kUnsharded,           // the unsharded parameter is registered and allocated
};

// "SHARDED", "SHARDED_POST_FORWARD", "UNSHARDED".
const char* ShardedStateName(ShardedState state);

}  // namespace fsdp::fsdp2
