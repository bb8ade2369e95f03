// The construction steps of an FSDP1 instance (PyTorch's _init_utils.py; docs/fsdp1.md,
// "Construction"), in the order FullyShardedDataParallel's constructor runs them:
//
//  1. InitIgnoredModuleStates: the ignored modules (with their subtrees, plus every nested
//     instance's), their parameters and buffer names.
//  2. InitProcessGroupState: the shard group (and for hybrid strategies the replicate group)
//     from process_group / inter_node_process_group / device_mesh, and the gradient pre/post
//     divide factors of the data-parallel size.
//  3. (auto wrapping, wrap.h)
//  4. InitCoreState: strategy (NO_SHARD at a group of size 1), mixed precision, offload,
//     prefetch, compute device; InitBufferState: buffer dtypes at construction.
//  5. InitParamHandleFromModule: moves the module to the compute device (unless offloading),
//     collects the managed parameters (not ignored, not owned by a nested instance), optionally
//     broadcasts them and the buffers from rank 0 (sync_module_states), builds and shards the
//     flat parameter.
//
// Free functions over the state being constructed; thread-safety: the constructing rank's
// thread.
#pragma once

#include <string>
#include <vector>

#include "engine/fsdp1/fsdp_state.h"
#include "engine/nn/module.h"

namespace fsdp::fsdp1 {

struct FullyShardedDataParallelOptions;

// "FullyShardedDataParallel(<Class>)": how construction errors name the wrapped module.
std::string DescribeWrappedModule(const nn::Module& module);

// `_init_ignored_module_states` (ignored_modules only).
void InitIgnoredModuleStates(FsdpState& state, const nn::Module& module,
                             const std::vector<nn::ModulePtr>& ignored_modules);

// `_init_process_group_state`. Throws InvalidArgument with PyTorch's messages for a process
// group and a mesh together, a hybrid strategy without its two groups or a 2-D mesh, and
// (engine checks) a hybrid strategy over a shard group of one rank, a non-hybrid strategy over
// a mesh that is not 1-D or with an inter-node group.
void InitProcessGroupState(FsdpState& state, const FullyShardedDataParallelOptions& options,
                           bool has_auto_wrap_policy, const std::string& who);

// `_init_core_state` + `_init_prefetching_state`.
void InitCoreState(FsdpState& state, const FullyShardedDataParallelOptions& options);

// `_init_buffer_state`.
void InitBufferState(FsdpState& state, const nn::Module& module);

// `_init_param_handle_from_module`: builds `state.handle` (stays null without managed
// parameters).
void InitParamHandleFromModule(FsdpState& state, nn::Module& module, bool sync_module_states,
                               const std::string& who);

// `_get_orig_params`: `module.parameters()` without the ignored ones and without those flattened
// by nested instances (their flat parameters and, with use_orig_params, original parameters).
std::vector<Tensor> GetOrigParams(const nn::Module& module,
                                  const std::set<const TensorImpl*>& ignored_params);

// `_sync_module_params_and_buffers`: broadcasts from group rank 0 the module's buffers not yet
// synced by a nested instance and `params` (one coalesced broadcast per dtype, `c10d.broadcast_`).
void SyncModuleParamsAndBuffers(const nn::Module& module, const std::vector<Tensor>& params,
                                const std::shared_ptr<distributed::ProcessGroup>& process_group);

}  // namespace fsdp::fsdp1
