// Module-level activation checkpointing, the three forms the seeds use (checkpoint_impl
// "utils", "composable" and ModelArgs.checkpoint_activations), all non-reentrant and built on
// autograd::CheckpointRegion / autograd::checkpoint (engine/autograd/checkpoint.h):
//
//  * CheckpointWrapper / checkpoint_wrapper(module) / apply_activation_checkpointing(model,
//    check_fn): torch.distributed.algorithms._checkpoint.checkpoint_wrapper. The wrapper's
//    only child is `_checkpoint_wrapped_module`, so FQNs reached through the wrapper gain
//    "_checkpoint_wrapped_module." (named_parameters called on the wrapper itself strips it,
//    as ActivationWrapper.named_parameters does); a state-dict post-hook strips it from the
//    keys and a load pre-hook adds it back.
//  * checkpoint(module): torch.distributed._composable.checkpoint. Registers a with_kwargs
//    forward pre-hook (appended) that enters a CheckpointRegion, and a forward hook
//    (prepend=True, always_call=True) that exits it. FQNs are unchanged. The recompute calls
//    the module's full operator() with the checkpoint's own two hooks switched off, so every
//    other hook of the module and its submodules runs again (docs/modules.md, "[Note:
//    activation checkpointing forms]").
//  * CheckpointModuleCall(module, args): torch.utils.checkpoint.checkpoint(module, *args) for
//    one call (Transformer's per-block checkpointing).
//
// Inputs and outputs are Values: every tensor of the args and kwargs is an input of the
// region (non-tensor leaves are kept in the captured structure).
// Ownership: regions are owned by the calling forward (wrapper, function form) or by the
// module's "checkpoint" attachment between its pre-hook and forward hook (composable).
// Thread-safety: as Module.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/checkpoint.h"
#include "engine/nn/module.h"

namespace fsdp::nn {

// "_checkpoint_wrapped_module" and its dotted prefix.
inline constexpr const char* kCheckpointWrappedModule = "_checkpoint_wrapped_module";
inline constexpr const char* kCheckpointPrefix = "_checkpoint_wrapped_module.";

// torch.distributed.utils._replace_by_prefix: every key starting with old_prefix is moved
// (to the end, as Python's `d[new] = d.pop(old)` does) under new_prefix.
void ReplaceByPrefix(StateDict& state_dict, const std::string& old_prefix,
                     const std::string& new_prefix);

// ActivationWrapper + CheckpointWrapper(checkpoint_impl=NO_REENTRANT).
class CheckpointWrapper : public Cloneable<CheckpointWrapper> {
 public:
  explicit CheckpointWrapper(ModulePtr module, autograd::CheckpointOptions options = {});
  ModulePtr wrapped_module() const { return child(kCheckpointWrappedModule); }
  Value forward(const Value& args) override;
  Value forward_with_kwargs(const Value& args, const Value& kwargs) override;
  std::vector<NamedTensor> named_parameters(const std::string& prefix = "", bool recurse = true,
                                            bool remove_duplicate = true) const override;

 private:
  autograd::CheckpointOptions options_;
};

// checkpoint_wrapper(module).
std::shared_ptr<CheckpointWrapper> checkpoint_wrapper(ModulePtr module,
                                                      autograd::CheckpointOptions options = {});

// apply_activation_checkpointing(model, check_fn=check_fn): post-order over named_children
// (shared children are replaced under their first name only), replacing each child for which
// check_fn is true by checkpoint_wrapper(child); the root itself is never wrapped.
void apply_activation_checkpointing(const ModulePtr& model,
                                    const std::function<bool(Module&)>& check_fn,
                                    autograd::CheckpointOptions options = {});

// torch.distributed._composable.checkpoint(module). Applying it twice to one module throws.
ModulePtr checkpoint(const ModulePtr& module, autograd::CheckpointOptions options = {});
// True when checkpoint(module) was applied.
bool HasComposableCheckpoint(const Module& module);

// torch.utils.checkpoint.checkpoint(module, args, use_reentrant=False): runs module(args)
// inside a checkpoint region whose recompute calls module(args) again.
Value CheckpointModuleCall(const ModulePtr& module, const Value& args,
                           autograd::CheckpointOptions options = {});

}  // namespace fsdp::nn
