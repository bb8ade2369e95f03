// ExecOrderData: the execution orders FSDP1 prefetches by (PyTorch's _exec_order_utils.py;
// docs/fsdp1.md, "Prefetch orders"):
//
//  * the pre-forward order, recorded in the first iteration only (forward_prefetch targets the
//    handle after the current one in it, limit 1);
//  * the post-forward order, recorded every iteration and cleared at the end of each backward
//    (backward prefetch targets the handle before the current one's post-forward index, limit
//    1). A handle used again in the same forward is appended again without moving its index,
//    except a handle whose index is 0, which PyTorch's truthiness test re-indexes.
// Forward-order validation across ranks (a debug-level feature) is not implemented.
//
// Ownership: owned by the root FullyShardedDataParallel and shared (std::shared_ptr) with every
// instance of its tree; holds non-owning pointers to the handles, which live as long as the
// module tree. Thread-safety: used by its rank's thread only.
#pragma once

#include <vector>

namespace fsdp::fsdp1 {

class FlatParamHandle;

class ExecOrderData {
 public:
  // Fixes the order of all handles of the root's tree (pre-order of the FSDP instances).
  void init(std::vector<FlatParamHandle*> all_handles);
  const std::vector<FlatParamHandle*>& all_handles() const { return all_handles_; }
  bool is_first_iter() const { return iter_ == 0; }

  // `get_handle_to_backward_prefetch`: the post-forward entry before `current`'s index, or
  // nullptr.
  FlatParamHandle* get_handle_to_backward_prefetch(const FlatParamHandle& current) const;
  // `get_handle_to_forward_prefetch`: the pre-forward entry after `current`'s, or nullptr.
  FlatParamHandle* get_handle_to_forward_prefetch(const FlatParamHandle& current) const;

  void record_post_forward(FlatParamHandle* handle);
  // Records the first iteration's pre-forward order (first use of each handle).
  void record_pre_forward(FlatParamHandle* handle);
  // End of an iteration (the root's end-of-backward callback): clears the post-forward order.
  void next_iter();

  const std::vector<FlatParamHandle*>& handles_pre_forward_order() const {
    return handles_pre_forward_order_;
  }
  const std::vector<FlatParamHandle*>& handles_post_forward_order() const {
    return handles_post_forward_order_;
  }

 private:
  static constexpr int kBackwardPrefetchLimit = 1;
  static constexpr int kForwardPrefetchLimit = 1;
  std::vector<FlatParamHandle*> all_handles_;
  std::vector<FlatParamHandle*> handles_pre_forward_order_;
  std::vector<FlatParamHandle*> handles_post_forward_order_;
  int iter_ = 0;
};

}  // namespace fsdp::fsdp1
