#include "engine/fsdp1/exec_order.h"

#include <utility>

#include "engine/fsdp1/flat_param.h"

namespace fsdp::fsdp1 {

void ExecOrderData::init(std::vector<FlatParamHandle*> all_handles) {
  all_handles_ = std::move(all_handles);
}

FlatParamHandle* ExecOrderData::get_handle_to_backward_prefetch(
    const FlatParamHandle& current) const {
  if (!current.post_forward_index.has_value()) return nullptr;
  int target_index = *current.post_forward_index - 1;
  FlatParamHandle* target = nullptr;
  for (int i = 0; i < kBackwardPrefetchLimit; ++i) {
    if (target_index < 0) break;
    target = handles_post_forward_order_.at(static_cast<size_t>(target_index));
    --target_index;
  }
  return target;
}

FlatParamHandle* ExecOrderData::get_handle_to_forward_prefetch(
    const FlatParamHandle& current) const {
  if (!current.pre_forward_order_index.has_value()) return nullptr;
  size_t target_index = static_cast<size_t>(*current.pre_forward_order_index) + 1;
  FlatParamHandle* target = nullptr;
  for (int i = 0; i < kForwardPrefetchLimit; ++i) {
    if (target_index >= handles_pre_forward_order_.size()) break;
    target = handles_pre_forward_order_[target_index];
    ++target_index;
  }
  return target;
}

void ExecOrderData::record_post_forward(FlatParamHandle* handle) {
  if (handle == nullptr) return;
  // PyTorch tests the index for truthiness: only a non-zero index counts as recorded.
  if (handle->post_forward_index.has_value() && *handle->post_forward_index != 0) {
    handles_post_forward_order_.push_back(handle);
    return;
  }
  handle->post_forward_index = static_cast<int>(handles_post_forward_order_.size());
  handles_post_forward_order_.push_back(handle);
}

void ExecOrderData::record_pre_forward(FlatParamHandle* handle) {
  if (handle == nullptr) return;
  // Fixed after the first iteration; only the first use of a handle counts.
  if (!is_first_iter() || handle->pre_forward_order_index.has_value()) return;
  handle->pre_forward_order_index = static_cast<int>(handles_pre_forward_order_.size());
  handles_pre_forward_order_.push_back(handle);
}

void ExecOrderData::next_iter() {
  ++iter_;
  handles_post_forward_order_.clear();
}

}  // namespace fsdp::fsdp1
