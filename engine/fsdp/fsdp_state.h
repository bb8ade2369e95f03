// FsdpState: the per-fully_shard-call hook owner (PyTorch's FSDPState; docs/fsdp-behaviour.md,
// "fully_shard and lazy init" through "End-of-backward callback"):
//
//  * forward pre-hook (prepended, with kwargs) and forward hook on the module (for a state of
//    several modules, fully_shard([m1, m2]), group hooks on each: the pre-hook runs upon the
//    first of them to run forward, the post-hook upon the last; `_register_group_forward_hooks`):
//    AC-recompute
//    early return in PRE_BACKWARD, lazy init + iteration root, input cast, the group's
//    pre_forward (unshard, wait, post-backward function on the inputs), explicit forward
//    prefetch; the group's post_forward (reshard, post-forward order), a pre-backward tensor
//    hook on every output tensor that requires grad, output cast.
//  * lazy init at the first forward of any FSDP module: root detection (the first state to
//    run forward; a root must be a single module), all_states in pre-order, the root's
//    reshard-after-forward override (per the root's Semantics: torch-2.4 always keeps the root
//    unsharded after forward, torch-2.8 only when its reshard_after_forward was left None;
//    semantics.h), FQNs, shared CommContext and StateContext.
//  * pre-backward (from the output tensor hooks): PRE_BACKWARD, queue the root end-of-
//    backward callback once per backward, the group's pre_backward (guarded), explicit
//    backward prefetch.
//  * the end-of-backward callback: post_backward() on every group still UNSHARDED (E2 /
//    early E3, as the seeds assert; [Note: end-of-backward sweep] in docs/fsdp.md), all
//    states and groups IDLE, and with is_last_backward the finalization (pending prefetches
//    dropped, post-forward order cleared).
//
// Ownership: owned by its modules through each one's "fully_shard" attachment
// (std::shared_ptr); the modules' hooks, tensor hooks and the queued callback hold it weakly.
// It holds raw pointers to its modules and to the other states of its tree (all owned by the
// same module tree). Owns its parameter group (shared with autograd nodes, weakly).
// Thread-safety: used by its rank's thread only.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd/hooks.h"
#include "engine/fsdp/comm_context.h"
#include "engine/fsdp/fsdp_api.h"
#include "engine/fsdp/fsdp_param_group.h"
#include "engine/fsdp/semantics.h"
#include "engine/fsdp/training_state.h"
#include "engine/nn/value.h"

namespace fsdp::nn {
class Module;
}

namespace fsdp::fsdp2 {

class FsdpState;

// State shared by every FSDP state of one root (PyTorch's FSDPStateContext).
struct StateContext {
  std::vector<FsdpState*> all_states;  // root pre-order
  FsdpState* iter_forward_root = nullptr;
  bool post_backward_final_callback_queued = false;
  bool is_last_backward = true;  // set_is_last_backward
  // set_post_optim_event: consumed by the next root pre-forward, whose all-gather streams then
  // wait for this event instead of for the whole current stream.
  std::optional<CommEvent> post_optim_event;
};

class FsdpState : public std::enable_shared_from_this<FsdpState> {
 public:
  // `auto_reshard_after_forward`: PyTorch's `_auto_reshard_after_forward`, true when
  // fully_shard was given reshard_after_forward=None (semantics.h).
  // `modules`: the modules fully_shard was given (at least one; several share this state).
  FsdpState(std::vector<nn::Module*> modules, Device device, MixedPrecisionPolicy mp_policy,
            Semantics semantics = kDefaultSemantics, bool auto_reshard_after_forward = false);
  ~FsdpState();
  FsdpState(const FsdpState&) = delete;
  FsdpState& operator=(const FsdpState&) = delete;

  // Registers the forward hooks on the modules (called once by fully_shard, after the state
  // is owned by a shared_ptr).
  void register_hooks();

  // The first module fully_shard was given; modules() all of them, in the order given.
  nn::Module* module() const { return modules_.front(); }
  const std::vector<nn::Module*>& modules() const { return modules_; }
  Device device() const { return device_; }
  const MixedPrecisionPolicy& mp_policy() const { return mp_policy_; }
  Semantics semantics() const { return semantics_; }
  bool auto_reshard_after_forward() const { return auto_reshard_after_forward_; }
  // set_reshard_after_forward clears it: the value is then the user's.
  void set_auto_reshard_after_forward(bool value) { auto_reshard_after_forward_ = value; }
  const std::shared_ptr<FsdpParamGroup>& param_group() const { return param_group_; }
  void set_param_group(std::shared_ptr<FsdpParamGroup> group) { param_group_ = std::move(group); }
  TrainingState training_state() const { return training_state_; }
  // Unset before lazy init; then true for the root only.
  std::optional<bool> is_root() const { return is_root_; }
  const std::shared_ptr<StateContext>& state_ctx() const { return state_ctx_; }
  const std::shared_ptr<CommContext>& comm_ctx() const { return comm_ctx_; }

  // Explicit prefetch lists (set_modules_to_forward_prefetch / _backward_prefetch).
  std::vector<FsdpState*> states_to_forward_prefetch;
  std::vector<FsdpState*> states_to_backward_prefetch;

  // ---- Hook bodies (public for the FSDPModule facet and tests) ----
  std::optional<std::pair<nn::Value, nn::Value>> pre_forward(nn::Module& module,
                                                             const nn::Value& args,
                                                             const nn::Value& kwargs);
  std::optional<nn::Value> post_forward(nn::Module& module, const nn::Value& output);
  void lazy_init();
  void pre_backward();
  void root_post_backward_final_callback();

 private:
  void root_pre_forward();
  void init_fqns();
  void init_shared_state();
  nn::Value register_pre_backward_hook(const nn::Value& output);
  void register_root_post_backward_final_callback();
  void backward_prefetch();
  void finalize_backward();
  void check_module(const nn::Module& module) const;
  // The name PyTorch's module tracker (CommDebugMode) gives `module`: the lazy-init root's class
  // name as fully_shard makes it ("FSDP" + the class), then ".fqn" (set by lazy init).
  std::string comm_module_name(const nn::Module& module) const;

  std::vector<nn::Module*> modules_;
  Device device_;
  MixedPrecisionPolicy mp_policy_;
  Semantics semantics_;
  bool auto_reshard_after_forward_;
  std::shared_ptr<FsdpParamGroup> param_group_;
  std::optional<bool> is_root_;
  TrainingState training_state_ = TrainingState::kIdle;
  std::shared_ptr<StateContext> state_ctx_;
  std::shared_ptr<CommContext> comm_ctx_;
  // Group forward hooks: the modules whose forward has not run since the group pre-hook ran.
  std::set<const nn::Module*> modules_to_run_forward_;
  std::vector<autograd::RemovableHandle> forward_hook_handles_;
  // CommDebugMode attribution: each module's tracker name, and the frame the pre-forward
  // entered (left by the post-forward).
  std::map<const nn::Module*, std::string> comm_module_names_;
  std::optional<size_t> forward_comm_depth_;
};

// The FSDP state of `module` (nullptr when fully_shard was not applied to it).
FsdpState* GetFsdpState(const nn::Module& module);

}  // namespace fsdp::fsdp2
