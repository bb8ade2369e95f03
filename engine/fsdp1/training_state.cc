#include "engine/fsdp1/training_state.h"

namespace fsdp::fsdp1 {

const char* TrainingStateName(TrainingState state) {
  switch (state) {
    case TrainingState::kIdle: return "IDLE";
    case TrainingState::kForwardBackward: return "FORWARD_BACKWARD";
    case TrainingState::kSummonFullParams: return "SUMMON_FULL_PARAMS";
  }
  return "?";
}

const char* HandleTrainingStateName(HandleTrainingState state) {
  switch (state) {
    case HandleTrainingState::kIdle: return "IDLE";
    case HandleTrainingState::kForward: return "FORWARD";
    case HandleTrainingState::kBackwardPre: return "BACKWARD_PRE";
    case HandleTrainingState::kBackwardPost: return "BACKWARD_POST";
    case HandleTrainingState::kSummonFullParams: return "SUMMON_FULL_PARAMS";
  }
  return "?";
}

fsdp2::TrainingState ToObserverState(HandleTrainingState state) {
  switch (state) {
    case HandleTrainingState::kForward: return fsdp2::TrainingState::kForward;
    case HandleTrainingState::kBackwardPre: return fsdp2::TrainingState::kPreBackward;
    case HandleTrainingState::kBackwardPost: return fsdp2::TrainingState::kPostBackward;
    case HandleTrainingState::kIdle:
    case HandleTrainingState::kSummonFullParams: return fsdp2::TrainingState::kIdle;
  }
  return fsdp2::TrainingState::kIdle;
}

}  // namespace fsdp::fsdp1
