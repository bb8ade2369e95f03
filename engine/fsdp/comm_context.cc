#include "engine/fsdp/comm_context.h"

#include "engine/fsdp/fsdp_collectives.h"

namespace fsdp::fsdp2 {

CommContext::CommContext() = default;

void CommContext::lazy_init(Device device) {
  if (initialized_) return;
  device_ = device;
  initialized_ = true;
}

std::pair<CommStream*, CommStream*> CommContext::get_all_gather_streams(
    bool async_op, TrainingState training_state) {
  if (!async_op && (training_state == TrainingState::kForward ||
                    training_state == TrainingState::kPreBackward)) {
    return {&all_gather_copy_in_stream_, &all_gather_stream_};
  }
  return {&current_stream_, &current_stream_};
}

}  // namespace fsdp::fsdp2
