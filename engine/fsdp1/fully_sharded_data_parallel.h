// FullyShardedDataParallel (FSDP1): PyTorch's wrapper module
// torch.distributed.fsdp.FullyShardedDataParallel, decomposed like PyTorch's FSDP1 sources
// (docs/fsdp1.md):
//
//   auto model = std::make_shared<nn::TransformerWithSharedParams>(rank, /*add_bn=*/false);
//   fsdp1::FullyShardedDataParallelOptions options;
//   options.sharding_strategy = fsdp1::ShardingStrategy::kShardGradOp;
//   options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(
//       std::set<std::string>{"TransformerEncoderLayer", "TransformerDecoderLayer"});
//   auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
//   optim::SGD optim(fsdp_model->parameters(), {.lr = 0.01});
//   {
//     fsdp1::NoSync no_sync = fsdp_model->no_sync();   // accumulate without communication
//     loss(fsdp_model, batch0).backward();
//   }
//   loss(fsdp_model, batch1).backward();               // reduces the sum of both
//   optim.step();
//
// The wrapper registers the module it wraps as its child `_fsdp_wrapped_module`, so FQNs
// through it carry "_fsdp_wrapped_module." (CleanTensorName removes it; named_parameters()
// called on an instance removes it only inside summon_full_params, as PyTorch). It flattens
// the parameters it manages (those of the wrapped module's tree that are neither ignored nor
// managed by a nested instance) into one FlatParamHandle and shards it at construction. With
// use_orig_params=False the flat parameter is registered on the wrapped module as
// `_flat_param` and is what parameters() returns; with use_orig_params=True parameters()
// returns the original parameters, whose data are views into the flat parameter.
//
// Nested instances are created by `auto_wrap_policy` (children before the parent) or by hand
// (wrap children first, then the parent). The first instance to run forward becomes the root
// and lazily initializes the whole tree.
//
// State dicts: the constructor registers the FULL / SHARDED / LOCAL state-dict hooks
// (state_dict_utils.h); the type and config come from StateDictTypeScope / SetStateDictType
// (state_dict_type.h). A tensor-parallel (DTensor) extension hooks in where the handle
// flattens and unflattens parameters (FlatParamHandle's construction and get_unflat_views).
//
// Ownership: shared (std::shared_ptr, like any module); owns its child, its FsdpState and its
// handle. Thread-safety: a rank's module tree is used by its thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/distributed/device_mesh.h"
#include "engine/distributed/process_group.h"
#include "engine/fsdp1/api.h"
#include "engine/fsdp1/fsdp_state.h"
#include "engine/fsdp1/wrap_policy.h"
#include "engine/nn/module.h"

namespace fsdp::fsdp1 {

// The constructor's keyword arguments (defaults as PyTorch's).
struct FullyShardedDataParallelOptions {
  // The group to shard over. Default: null (the rank's default group). With a hybrid strategy
  // it is the intra-node (shard) group and `inter_node_process_group` must be set too (PyTorch's
  // tuple `(intra_node_group, inter_node_group)`).
  std::shared_ptr<distributed::ProcessGroup> process_group;
  // Hybrid strategies only: the replicate group. Default: null.
  std::shared_ptr<distributed::ProcessGroup> inter_node_process_group;
  // Instead of process groups: a 1-D mesh (shard over it) or, for a hybrid strategy, a 2-D mesh
  // (dim 0 replicate, dim 1 shard). Default: null.
  std::shared_ptr<distributed::DeviceMesh> device_mesh;
  // Default: FULL_SHARD. At a shard group of size 1 every strategy becomes NO_SHARD.
  ShardingStrategy sharding_strategy = ShardingStrategy::kFullShard;
  CPUOffload cpu_offload;          // Default: no offload
  // Which submodules become FSDP instances of their own. Default: null (none).
  std::shared_ptr<const AutoWrapPolicy> auto_wrap_policy;
  // Default: BACKWARD_PRE; nullopt is PyTorch's None.
  std::optional<BackwardPrefetch> backward_prefetch = BackwardPrefetch::kBackwardPre;
  MixedPrecision mixed_precision;  // Default: none (every dtype unset)
  // Modules (with their subtrees) whose parameters and buffers FSDP leaves alone. Default: none.
  std::vector<nn::ModulePtr> ignored_modules;
  // Broadcast the managed parameters and the buffers from rank 0 of the group at
  // construction. Default: false.
  bool sync_module_states = false;
  // Prefetch the next instance's all-gather in forward (first iteration's order). Default:
  // false.
  bool forward_prefetch = false;
  // The rate limiter (CUDA only; accepted and recorded, no effect on the CPU). Default: true.
  bool limit_all_gathers = true;
  // Keep the original parameters as the module's parameters. Default: false.
  bool use_orig_params = false;
};

class FullyShardedDataParallel;

// The no_sync() scope: while alive, no FSDP instance of the root's tree reduces gradients;
// on destruction the previous flags are restored. Move-only.
class NoSync {
 public:
  NoSync(NoSync&& other) noexcept;
  NoSync& operator=(NoSync&&) = delete;
  NoSync(const NoSync&) = delete;
  ~NoSync();

 private:
  friend class FullyShardedDataParallel;
  explicit NoSync(std::vector<std::pair<FullyShardedDataParallel*, bool>> old_flags)
      : old_flags_(std::move(old_flags)) {}
  std::vector<std::pair<FullyShardedDataParallel*, bool>> old_flags_;
};

class FullyShardedDataParallel : public nn::Module, public FsdpState {
 public:
  // Wraps `module` (see the file comment). Throws InvalidArgument for bad arguments (both a
  // process group and a mesh, a strategy the groups cannot serve, a module wrapped already,
  // FSDP modules among the ignored modules, auto wrapping over existing FSDP instances, scalar
  // parameters) with PyTorch's messages, naming the module.
  FullyShardedDataParallel(nn::ModulePtr module, FullyShardedDataParallelOptions options = {});
  ~FullyShardedDataParallel() override;

  // `_fsdp_wrapped_module`.
  nn::ModulePtr fsdp_wrapped_module() const { return child(kFsdpWrappedModule); }
  // `.module`: the wrapped module, or the module inside an activation-checkpoint wrapper.
  nn::ModulePtr module() const;
  // The options this instance was built with (auto wrapping hands them to the children).
  const FullyShardedDataParallelOptions& options() const { return options_; }
  bool has_params() const { return handle != nullptr; }
  // `check_is_root()`: runs lazy init if needed.
  bool check_is_root();

  // Returns every FSDP instance in `module`'s tree (pre-order, `module` itself included), or
  // only the roots (which lazily initializes them).
  static std::vector<FullyShardedDataParallel*> fsdp_modules(const nn::ModulePtr& module,
                                                             bool root_only = false);

  nn::Value forward(const nn::Value& args) override;
  nn::Value forward_with_kwargs(const nn::Value& args, const nn::Value& kwargs) override;
  // Inside summon_full_params, every "_fsdp_wrapped_module." is removed from the names.
  std::vector<nn::NamedTensor> named_parameters(const std::string& prefix = "",
                                                bool recurse = true,
                                                bool remove_duplicate = true) const override;

  // `no_sync()`: only on the root in IDLE, otherwise FailedPrecondition ("`no_sync()` on inner
  // FSDP instances is not supported. Please call `no_sync()` on root FSDP module.", naming
  // this instance).
  NoSync no_sync();

  // `clip_grad_norm_(max_norm, norm_type)` on the root: the total norm over every rank's
  // shards (all-reduced over the shard group; non-sharded gradients counted once), gradients
  // scaled by min(1, max_norm / (total + 1e-6)). Returns the total norm. norm_type may be
  // infinity (max).
  Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0);

 private:
  FullyShardedDataParallelOptions options_;
};

using FSDP = FullyShardedDataParallel;

// The FSDP instance that `module` is (nullptr for any other module).
FullyShardedDataParallel* AsFsdp(nn::Module& module);
const FullyShardedDataParallel* AsFsdp(const nn::Module& module);

}  // namespace fsdp::fsdp1
