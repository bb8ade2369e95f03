// fsdp_collectives: the stateless data paths of FSDP2 (PyTorch's _fsdp_collectives.py;
// docs/fsdp-behaviour.md, "All-gather", "Reduce-scatter", "Gradient divide factors"):
//
//  * foreach_all_gather: copy-in of every parameter's all-gather input, back to back in group
//    order, into this rank's slice [r*L, (r+1)*L) of one flat output buffer of W*L elements,
//    then one in-place all_gather_into_tensor (c10d `_allgather_base_`) over the group. The
//    buffer is rank-major then parameter-major. World size 1: no collective (E3).
//  * foreach_all_gather_copy_out: waits for the collective, views the buffer as [W, L], and
//    copies parameter i's column block [W, padded_numel_i] row by row into that parameter's
//    persistent all-gather output (= the padded unsharded parameter). A parameter sharded on
//    Shard(d > 0) (shard_placement_fn) is copied to a temporary first and chunk-cat'ed along
//    d into its output (FsdpParam::unshard_all_gathered).
//  * foreach_reduce: chunk-cat copy-in of the unsharded gradients (only the parameters that
//    have one; a Shard(d > 0) gradient first becomes torch.cat(torch.chunk(grad, W, dim=d),
//    dim=0)) at padded offsets into a [W, L'] reduce-scatter input in the reduce dtype,
//    optional pre-divide, reduce_scatter_tensor (c10d `_reduce_scatter_base_`) with the op of
//    ComputeDivideFactors (AVG for f32/bf16, SUM with pre/post divide for f16/f64, SUM at data-
//    parallel size 1, PREMUL_SUM for a user factor), HSDP all-reduce over the replicate group,
//    optional post-divide, cast to the original dtype, view-out of each new gradient shard at
//    the padded offsets, accumulation into existing sharded grads, and the sharded
//    parameters' post-accumulate-grad hooks (once per parameter per reduction).
//
// Streams (docs/fsdp-behaviour.md, "Streams and the implicit forward prefetch"; CPU: all
// no-ops): the all-gather copy-in runs under a guard of
// the copy-in stream after it waited for the current stream; the collective on the all-gather
// stream after it waited for the copy-in, then `all_gather_event` is recorded there; the
// copy-out runs on the current stream after waiting for that event. The reduce-scatter copy-in
// runs on the current stream; the reduce-scatter stream then waits for it and runs the
// collective, the HSDP all-reduce (on its own stream), the divides, the cast and the
// accumulation, recording `reduce_scatter_event` and `post_reduce_event`.
//
// Ownership: results own their buffers; parameters are borrowed.
// Thread-safety: stateless; called from the rank's thread.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/distributed/process_group.h"
#include "engine/distributed/work.h"
#include "engine/fsdp/comm_context.h"
#include "engine/fsdp/shard_layout.h"

namespace fsdp::fsdp2 {

class FsdpParam;

// PyTorch's AllGatherResult.
struct AllGatherResult {
  Tensor all_gather_output;                      // flat, W * L elements
  std::shared_ptr<distributed::Work> all_gather_work;   // set when issued with async_op
  CommEvent all_gather_event;                    // recorded after the collective
  // Per parameter, per all-gather input (one input per parameter here).
  std::vector<std::vector<DType>> param_all_gather_input_dtypes;
  std::vector<std::vector<int64_t>> param_all_gather_input_numels;
  // All inputs flattened in order (the column split of the [W, L] view).
  std::vector<int64_t> all_gather_input_split_sizes;
};

// Issues the all-gather of `fsdp_params`' all-gather inputs over `group`. All inputs must
// share one dtype (mixed dtypes would need a byte all-gather, which this engine rejects).
std::shared_ptr<AllGatherResult> foreach_all_gather(
    const std::vector<FsdpParam*>& fsdp_params, const std::shared_ptr<distributed::ProcessGroup>& group,
    bool async_op, CommStream& all_gather_copy_in_stream, CommStream& all_gather_stream,
    Device device);

// Waits for the all-gather and copies each parameter's block into its all-gather outputs
// (created and re-allocated here as needed).
void foreach_all_gather_copy_out(AllGatherResult& all_gather_result,
                                 const std::vector<FsdpParam*>& fsdp_params,
                                 const std::shared_ptr<distributed::ProcessGroup>& group);

// Options of foreach_reduce beyond the parameters, gradients and group.
struct ForeachReduceOptions {
  // The sharded parameters' dtype; the new gradient shards end in it.
  DType orig_dtype = DType::kFloat32;
  // Dtype of the reduce-scatter. Default: unset (the gradients' dtype).
  std::optional<DType> reduce_dtype;
  Device device;
  // HSDP: all-reduce the reduce-scatter output over this group. Default: null (FSDP).
  std::shared_ptr<distributed::ProcessGroup> all_reduce_group;
  // HSDP with set_requires_all_reduce(false): the output is summed into the partial reduce
  // output instead and no gradient is assigned. Default: true.
  bool all_reduce_grads = true;
  // HSDP: the partial sums kept from earlier reductions without all-reduce (undefined: none);
  // added back before the next all-reduce. Default: none.
  Tensor partial_reduce_output;
  // From set_gradient_divide_factor; <= 0 means unset. Default: unset.
  double gradient_divide_factor = 0.0;
  // From set_force_sum_reduction_for_comms. Default: false.
  bool force_sum_reduction_for_comms = false;
  // Streams of the reduce-scatter and of the HSDP all-reduce. Default: null, i.e. the current
  // stream for the reduce-scatter and the reduce-scatter's stream for the all-reduce.
  CommStream* reduce_scatter_stream = nullptr;
  CommStream* all_reduce_stream = nullptr;
};

// What foreach_reduce leaves behind (kept by the CommContext until the next reduction).
struct ForeachReduceResult {
  Tensor reduce_scatter_input;  // flat, reduce dtype, W * L' elements (after any pre-divide)
  Tensor reduce_output;         // flat, L' elements, original dtype (views of it are grads)
  DivideFactors divide_factors;
  // HSDP: the partial sums to keep when the all-reduce was deferred (else undefined).
  Tensor partial_reduce_output;
  CommEvent reduce_scatter_event;  // the input may be freed after it
  CommEvent post_reduce_event;     // the new gradient shards are ready after it
};

// Reduces `unsharded_grads` (parallel to `fsdp_params`, same order, each of the parameter's
// global shape) and accumulates the new shards into the sharded parameters' grads.
// `unsharded_grads` is released after the copy-in.
ForeachReduceResult foreach_reduce(const std::vector<FsdpParam*>& fsdp_params,
                                   std::vector<Tensor> unsharded_grads,
                                   const std::shared_ptr<distributed::ProcessGroup>& reduce_scatter_group,
                                   const ForeachReduceOptions& options);

// In-place `t /= factor` without autograd (PyTorch's `_div_if_needed`, shared by FSDP1's
// gradient pre/post-divide); a factor of 1 and an empty tensor are skipped.
void DivIfNeeded(const Tensor& t, double factor);

// The [W, L] chunk-cat of `grads` (torch._chunk_cat(grads, dim=0, num_chunks=W)) written into
// the flat `out` (W * L elements, any float dtype; converted on copy): row k holds, for each
// grad in order, its k-th dim-0 chunk of ceil(d0/W) rows, zero-padded, flattened.
void foreach_reduce_scatter_copy_in(const std::vector<Tensor>& grads, const Tensor& out,
                                    int world_size);

}  // namespace fsdp::fsdp2
