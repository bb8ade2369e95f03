#include "engine/fsdp/training_state.h"

namespace fsdp::fsdp2 {

const char* TrainingStateName(TrainingState state) {
  switch (state) {
    case TrainingState::kForward: return "FORWARD";
    case TrainingState::kPreBackward: return "PRE_BACKWARD";
    case TrainingState::kPostBackward: return "POST_BACKWARD";
    case TrainingState::kIdle: return "IDLE";
  }
  return "UNKNOWN";
}

const char* ShardedStateName(ShardedState state) {
  switch (state) {
    case ShardedState::kSharded: return "SHARDED";
    case ShardedState::kShardedPostForward: return "SHARDED_POST_FORWARD";
    case ShardedState::kUnsharded: return "UNSHARDED";
  }
  return "UNKNOWN";
}

}  // namespace fsdp::fsdp2
