// FSDP1's tensor-parallel extension: PyTorch's `FSDPExtensions` hooks
// (torch/distributed/fsdp/_fsdp_extensions.py) as `DTensorExtensions` implements them
// (torch/distributed/tensor/parallel/fsdp.py), for a module that parallelize_module or
// distribute_module made tensor-parallel before FullyShardedDataParallel wraps it on the dp
// submesh (`FSDP(tp_model, device_mesh=mesh_2d["dp"])`):
//
//   pre_flatten_transform   (`_ext_pre_flatten_transform`) a DTensor parameter is flattened as
//                           its local tensor (`_local_tensor`: the slot already holds it, see
//                           engine/tensor_parallel/dtensor_parameter.h); the DTensor itself
//                           (mesh, placements, global shape) is kept as the parameter's
//                           extension. The flat parameter then holds TP-local pieces and is
//                           sharded over dp only.
//   post_unflatten_transform (`_ext_post_unflatten_transform`) each unflattened view of such a
//                           parameter is recorded as DTensor.from_local(view, mesh, placements,
//                           shape) (run_check=False), so GetDTensorParameter describes the
//                           tensor the module computes with (inside forward and
//                           summon_full_params).
//
// Gradients need nothing more: the styles and distribute_module wrap the slot's tensor at call
// time, so their collectives run inside the module's backward, on the TP group, before FSDP1's
// reduce-scatter of the flat gradient over dp. sync_module_states broadcasts each TP rank's
// local pieces within its dp group. FULL and SHARDED state dicts of such a module are not
// implemented (FSDP1 would save TP-local pieces under full-parameter names): they fail naming
// the parameter.
// Ownership: stateless functions; the extension (a DTensor value) is kept by the handle.
// Thread-safety: called on the module's rank thread.
#pragma once

#include <optional>
#include <string>

#include "engine/core/tensor.h"
#include "engine/nn/module.h"
#include "engine/tensor_parallel/dtensor.h"

namespace fsdp::fsdp1 {

// The extension of parameter `name` of `module` (registered as `param`): its DTensor, or
// nullopt for a plain parameter. Throws InvalidArgument when the slot does not hold the
// DTensor's local tensor (a parameter swapped after parallelization); `fqn` names it.
std::optional<tensor_parallel::DTensor> PreFlattenTransform(const nn::Module& module,
                                                            const std::string& name,
                                                            const Tensor& param,
                                                            const std::string& fqn);

// Records `view` (the tensor just installed as module.name) as the DTensor of parameter `name`
// with `extension`'s mesh, placements and global shape. No autograd node: the record is read,
// while the module's forward computes with the slot's tensor itself.
void PostUnflattenTransform(nn::Module& module, const std::string& name, const Tensor& view,
                            const tensor_parallel::DTensor& extension);

}  // namespace fsdp::fsdp1
