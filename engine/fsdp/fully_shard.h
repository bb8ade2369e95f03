// The FSDP2 API: fully_shard(module, options) and the FSDPModule facet (PyTorch's
// torch.distributed.fsdp.fully_shard and FSDPModule; docs/fsdp-behaviour.md, "fully_shard and
// lazy init", "Runtime switches", "Int reshard_after_forward", "Manual unshard and reshard").
//
//   auto model = std::make_shared<nn::Transformer>(nn::ModelArgs{});
//   for (const auto& block : model->layers()) fsdp2::fully_shard(block);
//   fsdp2::FSDPModule root = fsdp2::fully_shard(model);  // children before parents
//   Tensor loss = model->forward(tokens).tensor();         // or (*model)(tokens)
//   root.set_is_last_backward(true);
//
// fully_shard claims the parameters of `module` and of its submodules that are not already
// managed (post-order, tied weights once, ignored_params skipped), shards them immediately
// (the module's parameter slots then hold the sharded parameters), attaches an FsdpState to
// the module (Module attachment "fully_shard") and registers its forward hooks. A module is
// "an FSDP module" iff it carries that attachment: IsFsdpModule / FSDPModule(module).
// Parameters a parallel style made tensor-parallel are sharded on their TP-local tensors over
// the FSDP mesh, which must then be the dp submesh of the TP mesh's parent (FSDP2 × TP,
// tp_sharding.h).
//
// Ownership: the module owns its state; FSDPModule and UnshardHandle are cheap handles that
// share the module / group. Thread-safety: a rank's modules are used by its thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/distributed/device_mesh.h"
#include "engine/distributed/process_group.h"
#include "engine/fsdp/fsdp_api.h"
#include "engine/fsdp/fsdp_param_group.h"
#include "engine/fsdp/fsdp_state.h"
#include "engine/fsdp/mesh_info.h"
#include "engine/fsdp/semantics.h"
#include "engine/nn/module.h"
#include "engine/tensor_parallel/placement.h"

namespace fsdp::fsdp2 {

// fully_shard's `shard_placement_fn`: a parameter (the original tensor; a tensor-parallel
// parameter's TP-local tensor) → Shard(dim), or nullopt for Shard(0).
using ShardPlacementFn =
    std::function<std::optional<tensor_parallel::Placement>(const Tensor& param)>;

struct FullyShardOptions {
  // The FSDP mesh: 1-D (FSDP) or 2-D (HSDP: dim 0 replicate, dim 1 shard). Default: null
  // (use `process_group`).
  std::shared_ptr<distributed::DeviceMesh> mesh;
  // A 1-D FSDP group, used when `mesh` is null. Default: null (the rank's default group,
  // distributed::GetDefaultProcessGroup()).
  std::shared_ptr<distributed::ProcessGroup> process_group;
  // The PyTorch release whose rules apply where FSDP2 changed (semantics.h; docs/fsdp-behaviour.md,
  // "Semantics profiles"). Default: torch-2.4.
  Semantics semantics = kDefaultSemantics;
  // true: reshard after forward; false: keep unsharded until post-backward; int k: reshard to
  // groups of k ranks after forward (1 <= k <= W, W % k == 0); nullopt: None, the release's
  // default. torch-2.4 has no None: there nullopt is its default True, and lazy init keeps the
  // root unsharded after forward whatever the value. torch-2.8: None is True for non-root
  // modules and False for the root, and an explicit true or int also reshards the root.
  // Default: nullopt.
  std::optional<ReshardAfterForward> reshard_after_forward;
  MixedPrecisionPolicy mp_policy;  // Default: no mixed precision
  OffloadPolicy offload_policy;    // Default: no offload
  // Parameters left unmanaged (not sharded). Default: none.
  std::vector<Tensor> ignored_params;
  // Called once per managed parameter at fully_shard: returns its FSDP placement, Shard(dim)
  // (dim may be negative), or nullopt for the default Shard(0) (docs/fsdp-behaviour.md,
  // "shard_placement_fn"). A dim > 0 needs the parameter's size on it to divide by the shard
  // world size. Default: null (every parameter Shard(0)).
  ShardPlacementFn shard_placement_fn;
};

// FSDPModule.unshard(async_op=True)'s handle: wait() finishes the unshard (idempotent; a
// no-op for a module without parameters or after the module's own pre-forward waited).
class UnshardHandle {
 public:
  UnshardHandle() = default;
  explicit UnshardHandle(std::weak_ptr<FsdpParamGroup> group) : group_(std::move(group)) {}
  void wait();

 private:
  std::weak_ptr<FsdpParamGroup> group_;
};

// The FSDPModule methods of a module fully_shard was applied to.
class FSDPModule {
 public:
  // Throws InvalidArgument when fully_shard was not applied to `module`.
  explicit FSDPModule(nn::ModulePtr module);

  const nn::ModulePtr& module() const { return module_; }
  nn::Module* operator->() const { return module_.get(); }
  FsdpState& state() const { return *state_; }
  // The module's parameter group (null when it manages no parameters).
  FsdpParamGroup* param_group() const { return state_->param_group().get(); }

  // Runs the group's lazy init and all-gathers its parameters (non-recursive). With
  // async_op=false waits before returning; with true the caller (or the module's next
  // pre-forward) waits through the handle.
  UnshardHandle unshard(bool async_op = false);
  // Reshards the module's parameters (non-recursive); outside forward always to SHARDED.
  void reshard();

  void set_is_last_backward(bool is_last_backward);
  void set_requires_gradient_sync(bool requires_gradient_sync, bool recurse = true);
  void set_requires_all_reduce(bool requires_all_reduce, bool recurse = true);
  void set_reshard_after_backward(bool reshard_after_backward, bool recurse = true);
  // Bool only: recomputes the post-forward mesh of this module's (and with recurse every FSDP
  // submodule's) group; can also make the root reshard after forward. Under torch-2.8 it also
  // marks the value as set by the user (clears `auto_reshard_after_forward`), so a later lazy
  // init keeps it for the root.
  void set_reshard_after_forward(bool reshard_after_forward, bool recurse = true);
  void set_modules_to_forward_prefetch(const std::vector<nn::ModulePtr>& modules);
  void set_modules_to_backward_prefetch(const std::vector<nn::ModulePtr>& modules);
  void set_gradient_divide_factor(double factor);
  void set_force_sum_reduction_for_comms(bool enable);
  void set_unshard_in_backward(bool unshard_in_backward);
  // `_set_unshard_async_op` (torch 2.6+): for this module and every FSDP module under it, the
  // pre-forward and pre-backward all-gathers run with async_op=True, on the current stream.
  void set_unshard_async_op(bool async_op);
  // The next root pre-forward makes the all-gather streams wait for `event` (recorded by the
  // caller after its optimizer step) instead of for the current stream, then forgets it.
  // Call it on the root. On the CPU the event is a no-op, as every stream is.
  void set_post_optim_event(const CommEvent& event);

 private:
  // This module and, with recurse, every FSDP submodule's state.
  std::vector<FsdpState*> states(bool recurse) const;

  nn::ModulePtr module_;
  FsdpState* state_;
};

// Applies FSDP to `module` (see the file comment) and returns its FSDPModule facet.
FSDPModule fully_shard(const nn::ModulePtr& module, const FullyShardOptions& options = {});

// fully_shard([m1, m2, ...]): one FSDP state and one parameter group for several modules (a
// module under another given one is managed through it), so their parameters are all-gathered
// and reduce-scattered together. The group unshards in the pre-forward of the first of them to
// run forward and reshards in the post-forward of the last (if one of them does not run
// forward, the group stays unsharded until backward); its module FQN is the modules' FQNs
// joined by ", ". Such a state cannot be the root. Returns the FSDPModule of each given module
// that is not under another given one (all sharing the state), in the order given.
std::vector<FSDPModule> fully_shard(const std::vector<nn::ModulePtr>& modules,
                                    const FullyShardOptions& options = {});

// True when fully_shard was applied to `module`.
bool IsFsdpModule(const nn::Module& module);

}  // namespace fsdp::fsdp2
