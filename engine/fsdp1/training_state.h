// The two state machines of FSDP1 (PyTorch's _common_utils.TrainingState and
// _flat_param.HandleTrainingState), with PyTorch's spelling for events and error messages, and
// the mapping of a handle's state onto the event vocabulary FSDP2 uses (engine/fsdp/observer.h).
// See docs/fsdp1.md, "State machines". Value types; thread-safe.
#pragma once

#include <cstdint>

#include "engine/fsdp/training_state.h"

namespace fsdp::fsdp1 {

// An FSDP instance's state (`_FSDPState.training_state`).
enum class TrainingState : uint8_t {
  kIdle,              // outside forward and backward
  kForwardBackward,   // from its pre-forward to the end of backward
  kSummonFullParams,  // inside summon_full_params
};

// A flat parameter handle's state (`FlatParamHandle._training_state`).
enum class HandleTrainingState : uint8_t {
  kIdle,
  kForward,           // between the instance's pre-forward and post-forward
  kBackwardPre,       // its pre-backward hook ran; gradients are being computed
  kBackwardPost,      // its post-backward hook ran
  kSummonFullParams,  // inside summon_full_params
};

// "IDLE", "FORWARD_BACKWARD", "SUMMON_FULL_PARAMS".
const char* TrainingStateName(TrainingState state);
// "IDLE", "FORWARD", "BACKWARD_PRE", "BACKWARD_POST", "SUMMON_FULL_PARAMS".
const char* HandleTrainingStateName(HandleTrainingState state);

// The state an observer event reports (FSDP2's vocabulary): FORWARD -> FORWARD,
// BACKWARD_PRE -> PRE_BACKWARD, BACKWARD_POST -> POST_BACKWARD, IDLE and SUMMON_FULL_PARAMS ->
// IDLE.
fsdp2::TrainingState ToObserverState(HandleTrainingState state);

}  // namespace fsdp::fsdp1
