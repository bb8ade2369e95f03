// The tensor-parallel plans of the zoo models that parity/tp/* trains under FSDP2 × TP, and the
// oracle-side arithmetic of where each parameter's values land on a (dp, tp) mesh.
//
// Plans (PyTorch's MLPStack.parallelize and Transformer.parallelize, restricted to the styles
// this engine has: every style returns its local output, use_local_output=True, where
// MLPStack.parallelize keeps some DTensor outputs; the values are the same), derived from the
// parameter FQNs, any size:
//   mlp_stack    every "<i>.in_proj" ColwiseParallel(), every "<i>.out_proj" RowwiseParallel()
//   mlp_stack_seq_parallel
//                MLPStack.parallelize with with_seq_parallel=True: as mlp_stack, but
//                "2.out_proj" RowwiseParallel(output_layouts=Shard(1)) (its output
//                reduce-scattered onto the sequence dim) and the LayerNorm "3"
//                SequenceParallel(sequence_dim=1) (its weight Replicate, its gradient a Partial
//                sum over the rank's sequence piece, all-reduced over tp); the model's output is
//                the rank's Shard(1) piece, so its loss is a Partial sum over tp
//   transformer  per block "layers.<i>.attention.{wq,wk,wv}" and "layers.<i>.feed_forward.w1"
//                ColwiseParallel(), "layers.<i>.attention.wo" and "...feed_forward.w2"
//                RowwiseParallel(); each Attention then holds n_heads / tp heads (its colwise
//                output is whole heads), so tp must divide n_heads. The embeddings, norms and
//                the (tied) output projection stay plain (not tensor-parallel; embedding styles
//                are not implemented): every tp rank computes them alike, and FSDP shards them
//                over dp only.
// A parameter of a planned module gets its style's placement over tp (ParallelStyle::
// parameter_placements); under fully_shard over dp its shard on mesh coordinate (i, j) is the
// nested torch.chunk: piece j of the TP placement's dim over tp, then chunk i of dim 0 over dp
// (tp_sharding.h in the engine; written here independently on oracle tensors).
//
// Stateless; thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/distributed/device_mesh.h"
#include "engine/nn/module.h"
#include "engine/tensor_parallel/parallelize_module.h"
#include "reference/tensor.h"

namespace fsdp::conformance {

// The plan of zoo model `kind` over the module FQNs of `parameter_names` (in order). Throws
// InvalidArgument for a kind without a plan.
tensor_parallel::ParallelizePlan ZooTpPlan(const std::string& kind,
                                           const std::vector<std::string>& parameter_names);

// Applies ZooTpPlan to `module` over the 1-D `tp_mesh` (and divides the Transformer's heads).
// Throws InvalidArgument naming the module when tp does not divide n_heads.
void ParallelizeZooModel(const std::string& kind, nn::Module& module,
                         const std::shared_ptr<distributed::DeviceMesh>& tp_mesh);

// Whether zoo model `kind`'s output under its plan is the rank's Shard(1) piece of the sequence
// (mlp_stack_seq_parallel), so that a loss summed over it is the rank's Partial sum over tp.
bool ZooTpOutputIsSequenceSharded(const std::string& kind);

// FQN -> TP placement of every parameter the plan places (others are absent).
std::map<std::string, tensor_parallel::Placement> ZooTpPlacements(
    const std::string& kind, const std::vector<std::string>& parameter_names);

// The FQNs of the planned modules whose input needs a gradient: every planned module after a
// parameter of the model was used (parameters are registered in forward order in the zoo's
// models, whose inputs never require gradients), i.e. all but those that come before every
// parameter of another module.
std::vector<std::string> PlannedModulesWithInputGrad(
    const std::vector<std::string>& parameter_names, const tensor_parallel::ParallelizePlan& plan);

// Rank (dp_rank, tp_rank)'s shard of `full`: piece tp_rank of `tp_placement`'s dim over tp
// ranks (none: the whole tensor), then chunk dp_rank of dim 0 over dp ranks.
reference::RefTensor NestedShardOf(const reference::RefTensor& full,
                                   const std::optional<tensor_parallel::Placement>& tp_placement,
                                   int dp_rank, int dp, int tp_rank, int tp);

}  // namespace fsdp::conformance
