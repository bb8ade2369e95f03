// FsdpParamGroup: all parameters claimed by one fully_shard call (PyTorch's FSDPParamGroup):
// one all-gather to unshard them and one reduce-scatter per backward use to reduce their
// gradients. It owns the group's TrainingState and ShardedState and implements the runtime
// steps the FSDP state's hooks call (docs/fsdp-behaviour.md, "State machines" and "Forward
// hooks" through "Backward prefetch"):
//
//  * unshard(async_op) issues the all-gather (no-op when a result is pending, when already
//    UNSHARDED, or in PRE_BACKWARD with unshard_in_backward off); wait_for_unshard() copies
//    out and registers the unsharded parameters (UNSHARDED). The pending result is the
//    "prefetch" handle: a later unshard finds it and only the wait remains.
//  * reshard(): in FORWARD per reshard-after-forward (False: no-op; True: SHARDED; int:
//    SHARDED_POST_FORWARD); otherwise always SHARDED.
//  * pre_forward / post_forward: unshard+wait and wrap the inputs in the post-backward
//    autograd function / reshard, append to the post-forward order.
//  * pre_backward (guarded: once per PRE_BACKWARD), default backward prefetch (previous entry
//    of the post-forward order), post_backward (reduce-scatter of the grads that exist, then
//    reshard), finalize_backward.
// Streams (CUDA; no-ops on the CPU): see comm_context.h and fsdp_collectives.h.
// Every transition emits its event to the rank's observers (observer.h) and attributes its
// collectives to the module and phase for CommDebugMode.
//
// Ownership: owned by its FsdpState (std::shared_ptr; autograd nodes hold it weakly); owns
// its FsdpParams; shares the CommContext. Holds raw pointers to its modules.
// Thread-safety: used by its rank's thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/fsdp/comm_context.h"
#include "engine/fsdp/fsdp_api.h"
#include "engine/fsdp/fsdp_collectives.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/mesh_info.h"
#include "engine/fsdp/semantics.h"
#include "engine/fsdp/training_state.h"
#include "engine/nn/value.h"

namespace fsdp::nn {
class Module;
}

namespace fsdp::fsdp2 {

// A parameter to shard and where it is registered.
struct ParamToShard {
  Tensor param;
  ParamModuleInfo module_info;
  // shard_placement_fn's result for `param` (nullopt: the default Shard(0)).
  std::optional<tensor_parallel::Placement> fsdp_placement;
};

class FsdpParamGroup : public std::enable_shared_from_this<FsdpParamGroup> {
 public:
  // Shards every parameter immediately (each FsdpParam registers its sharded parameter).
  // `modules`: the modules fully_shard was given (one, or several for fully_shard([m1, m2])).
  // `semantics`: the fully_shard call's profile (semantics.h), which decides the mixed-precision
  // dtypes.
  FsdpParamGroup(std::vector<ParamToShard> params, std::vector<nn::Module*> modules,
                 FsdpMeshInfo mesh_info, std::optional<FsdpMeshInfo> post_forward_mesh_info,
                 Device device, MixedPrecisionPolicy mp_policy, OffloadPolicy offload_policy,
                 Semantics semantics = kDefaultSemantics);
  FsdpParamGroup(const FsdpParamGroup&) = delete;
  FsdpParamGroup& operator=(const FsdpParamGroup&) = delete;

  // Idempotent: re-pads replaced sharded params (first call), validates CPU offload
  // placement, computes the mixed-precision dtypes.
  void lazy_init();

  // ---- Runtime ----
  void unshard(bool async_op = false);
  void wait_for_unshard();
  void reshard();
  std::pair<nn::Value, nn::Value> pre_forward(const nn::Value& args, const nn::Value& kwargs);
  nn::Value post_forward(const nn::Value& output);
  void pre_backward(bool default_prefetch);
  void post_backward();
  void finalize_backward();
  // Default backward prefetch: pop this group's last post-forward index i and unshard
  // post_forward_order[i - 1] in temporary PRE_BACKWARD.
  void backward_prefetch();
  // Unshards `target` with its training state temporarily set to FORWARD (forward prefetch)
  // or PRE_BACKWARD (backward prefetch), without waiting.
  static void prefetch_unshard(FsdpParamGroup& target, TrainingState pass_state);

  // The sharded → sharded-post-forward and → unsharded transitions of the whole group (also
  // used directly by tests, like PyTorch's `_to_sharded_post_forward`).
  void to_sharded();
  void to_sharded_post_forward();
  void to_unsharded();

  // ---- State ----
  TrainingState training_state() const { return training_state_; }
  void set_training_state(TrainingState state) { training_state_ = state; }
  ShardedState sharded_state() const { return sharded_state_; }
  bool is_sharded() const { return sharded_state_ == ShardedState::kSharded; }
  bool is_sharded_post_forward() const {
    return sharded_state_ == ShardedState::kShardedPostForward;
  }
  bool is_unsharded() const { return sharded_state_ == ShardedState::kUnsharded; }
  // True while an all-gather result is pending (issued, not yet waited on).
  bool has_pending_all_gather() const { return all_gather_result_ != nullptr; }

  // ---- Identity and configuration ----
  // The module FQN from the lazy-init root ("" for the root; comma-joined when reached by
  // several paths). Empty before lazy init.
  std::string module_fqn() const { return module_fqn_.value_or(""); }
  void append_module_fqn(const std::string& fqn);
  // The name CommDebugMode credits this group's post-backward collectives to: its (first)
  // module's name as PyTorch's module tracker gives it (see FsdpState::comm_module_name).
  const std::string& comm_module_name() const { return comm_module_name_; }
  void set_comm_module_name(std::string name) { comm_module_name_ = std::move(name); }
  // The modules fully_shard was given (PyTorch's `modules`), in the order given.
  const std::vector<nn::Module*>& modules() const { return modules_; }
  const std::vector<std::unique_ptr<FsdpParam>>& fsdp_params() const { return fsdp_params_; }
  std::vector<FsdpParam*> fsdp_param_ptrs() const;
  const FsdpMeshInfo& mesh_info() const { return mesh_info_; }
  const std::optional<FsdpMeshInfo>& post_forward_mesh_info() const {
    return post_forward_mesh_info_;
  }
  // Also updates every parameter (set_reshard_after_forward, root override at lazy init).
  void set_post_forward_mesh_info(std::optional<FsdpMeshInfo> info);
  bool reshard_after_forward() const { return post_forward_mesh_info_.has_value(); }
  // True when the post-forward mesh differs from the FSDP mesh (int reshard_after_forward).
  bool use_post_forward_mesh() const;
  Device device() const { return device_; }
  const MixedPrecisionPolicy& mp_policy() const { return mp_policy_; }
  Semantics semantics() const { return semantics_; }
  const std::shared_ptr<CommContext>& comm_ctx() const { return comm_ctx_; }
  void set_comm_ctx(std::shared_ptr<CommContext> comm_ctx) { comm_ctx_ = std::move(comm_ctx); }
  // The group the current all-gather runs over (post-forward group in SHARDED_POST_FORWARD).
  const std::shared_ptr<distributed::ProcessGroup>& all_gather_process_group() const;
  const std::vector<int>& post_forward_indices() const { return post_forward_indices_; }

  // Runtime switches (FSDPModule setters). Defaults as in PyTorch.
  bool reduce_grads = true;            // set_requires_gradient_sync
  bool all_reduce_grads = true;        // set_requires_all_reduce (HSDP)
  bool reshard_after_backward = true;  // set_reshard_after_backward
  bool unshard_in_backward = true;     // set_unshard_in_backward
  bool unshard_async_op = false;       // _set_unshard_async_op
  double gradient_divide_factor = 0.0;  // set_gradient_divide_factor (<= 0: unset)
  bool force_sum_reduction_for_comms = false;

 private:
  void init_mixed_precision();
  // The dtype the reduce-scatter of `params_with_grad` runs in when the group has none of its
  // own (no parameter required grad at lazy init, or none was set): torch-2.15 promotes over
  // each parameter's reduce dtype, its original dtype without one (PyTorch's
  // FSDPParamGroup._get_reduce_dtype over FSDPParam.unsharded_grad_dtype); the earlier
  // profiles leave it to the gradients' dtype (nullopt).
  std::optional<DType> reduce_dtype_without_group_dtype(
      const std::vector<FsdpParam*>& params_with_grad) const;
  void validate_cpu_offload_params();
  void record_post_forward();
  std::pair<nn::Value, nn::Value> register_post_backward_hook(const nn::Value& args,
                                                              const nn::Value& kwargs);
  std::string with_fqn(const std::string& label) const;

  std::vector<nn::Module*> modules_;
  FsdpMeshInfo mesh_info_;
  std::optional<FsdpMeshInfo> post_forward_mesh_info_;
  Device device_;
  MixedPrecisionPolicy mp_policy_;
  OffloadPolicy offload_policy_;
  Semantics semantics_;
  std::vector<std::unique_ptr<FsdpParam>> fsdp_params_;
  std::optional<std::string> module_fqn_;
  std::string comm_module_name_;
  std::shared_ptr<CommContext> comm_ctx_;

  TrainingState training_state_ = TrainingState::kIdle;
  ShardedState sharded_state_ = ShardedState::kSharded;
  std::shared_ptr<AllGatherResult> all_gather_result_;
  std::vector<int> post_forward_indices_;
  bool reset_sharded_params_ = false;
  std::optional<DType> orig_dtype_;
  std::optional<DType> reduce_dtype_;
  // HSDP partial sums kept while set_requires_all_reduce(false).
  Tensor partial_reduce_output_;
  // The last reduction's post-reduce event; the current stream waits on it at
  // finalize_backward (before the optimizer step).
  std::optional<CommEvent> post_reduce_event_;
  // Recorded on the current stream when the post-forward reshard wrote the post-forward-mesh
  // shards there; the next unshard's all-gather streams wait for it (they read those shards).
  std::optional<CommEvent> reshard_after_forward_event_;
};

// Sets a group's training state for the guard's lifetime (PyTorch's use_training_state).
class TrainingStateGuard {
 public:
  TrainingStateGuard(FsdpParamGroup& group, TrainingState state);
  ~TrainingStateGuard();
  TrainingStateGuard(const TrainingStateGuard&) = delete;
  TrainingStateGuard& operator=(const TrainingStateGuard&) = delete;

 private:
  FsdpParamGroup& group_;
  TrainingState previous_;
};

}  // namespace fsdp::fsdp2
