// distribute_module(module, device_mesh, partition_fn, input_fn, output_fn), like
// torch.distributed.tensor.distribute_module (_api.py): turns a module into one that works on
// DTensors over `device_mesh`.
//
//   partition_fn(name, submodule, mesh)  called for every submodule (named_modules order);
//                                        default (none): every parameter and buffer that is not
//                                        tensor-parallel yet becomes Replicate() on every mesh
//                                        dim (distribute_tensor, src_data_rank 0; parameters
//                                        are recorded with RegisterDTensorParameter, buffers keep
//                                        their replicated local tensor in the buffer slot)
//   input_fn(module, inputs, mesh)       a forward pre-hook: the module's input as a DTensor
//                                        (e.g. DTensor::from_local(inputs[0], mesh, {Shard(0)}));
//                                        default: the input tensor as Replicate()
//   output_fn(module, output, mesh)      a forward hook: what the module returns, given its
//                                        output as a DTensor (e.g. output.to_local()); default:
//                                        the output's local tensor
//
// The engine has no DTensor op dispatch: the module's forward computes on local tensors. What
// DTensor's sharding propagation would decide is derived from the placements instead, for a
// module that acts on the last (feature) dim of its input row by row (Linear, LayerNorm,
// RMSNorm and compositions of them): every other input dim is a batch dim, which indexes no
// parameter. Per mesh dim, an input that is
//   Replicate()          gives a Replicate() output, and each replicated parameter's gradient
//                        is Replicate();
//   Shard(d), d a batch dim
//                        gives a Shard(d) output (rows stay where they are), and each
//                        replicated parameter's gradient is Partial(sum): every rank sums its
//                        own rows' contributions;
//   Shard(last dim) or Partial
//                        needs sharding propagation through the module's ops: rejected, naming
//                        the module, the input and the placements.
// During the call each replicated parameter's slot holds DTensor.from_local(slot tensor,
// Replicate()).to_local(grad_placements), so its gradient comes back through from_local's
// backward, which brings a Partial gradient to Replicate() with one c10d_functional.all_reduce
// per parameter and mesh dim (as PyTorch's from_local(Replicate) re-wrapping under FSDP1 does;
// without FSDP PyTorch leaves the Partial DTensor in .grad, which this engine's plain .grad
// cannot carry, so the all-reduce happens in backward either way). The slot gets its tensor
// back after the call. A parameter that is sharded already (a parallel style ran first) is
// rejected: the rule above covers replicated parameters only.
//
// Ownership: the hooks are owned by `module`; they hold the mesh and copies of the functions.
// Thread-safety: call on the module's rank thread (partitioning is collective over the mesh).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/distributed/device_mesh.h"
#include "engine/nn/module.h"
#include "engine/tensor_parallel/dtensor.h"

namespace fsdp::tensor_parallel {

using PartitionFn = std::function<void(const std::string& name, nn::Module& module,
                                       const std::shared_ptr<distributed::DeviceMesh>& mesh)>;
using InputFn = std::function<DTensor(nn::Module& module, const nn::Value& inputs,
                                      const std::shared_ptr<distributed::DeviceMesh>& mesh)>;
using OutputFn = std::function<nn::Value(nn::Module& module, const DTensor& output,
                                         const std::shared_ptr<distributed::DeviceMesh>& mesh)>;

nn::Module& distribute_module(nn::Module& module,
                              const std::shared_ptr<distributed::DeviceMesh>& device_mesh,
                              PartitionFn partition_fn = nullptr, InputFn input_fn = nullptr,
                              OutputFn output_fn = nullptr);

// The placements of the gradient of a Replicate() parameter of a module applied row by row to
// an input of `input_ndim` dims with `input_placements` (see the file comment): Partial(sum)
// on every mesh dim where the input is sharded on a batch dim, Replicate() elsewhere. Throws
// InvalidArgument for a Shard on the last dim or a Partial input; `what` names the module.
Placements ReplicatedParamGradPlacements(const Placements& input_placements, int64_t input_ndim,
                                         const std::string& what);

}  // namespace fsdp::tensor_parallel
