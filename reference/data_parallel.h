// What a data-parallel training step MEANS, computed unsharded in one process: the yardstick for
// FSDP/DDP train-parity scenarios.
//
// Semantics (as the seeds use them): W ranks hold replicas of the same parameters. In a step,
// rank r runs forward + loss + backward on ITS input (usually rows [r·b, (r+1)·b) of a global
// batch of W·b rows), giving a per-rank loss and per-rank gradients. The synchronised gradient
// of a parameter is the AVERAGE over ranks of the per-rank gradients (FSDP's reduce-scatter /
// DDP's all-reduce with divide factor W); a parameter absent on every rank stays absent (None).
// The averaged gradient is accumulated into `.grad` (which persists until zero_grad), then the
// optimizer steps (skipping absent gradients), the scheduler steps, and zero_grad runs.
// Buffers are per rank: BatchNorm running statistics evolve from each rank's own batches.
//
// Consequences worth knowing: with a mean-reduced loss and equal per-rank batch sizes, the DP
// gradient equals the full-batch gradient; with a sum loss it is the full-batch gradient / W.
//
// Thread-safety: pure functions over their arguments (the optimizer is mutated). Ownership:
// records are values; the optimizer and scheduler are borrowed.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "reference/model.h"
#include "reference/optimizers.h"
#include "reference/tensor.h"

namespace fsdp::reference {

// Rank r's slice of every set member of `global`: rows [r·b, (r+1)·b) of dim 0 with
// b = rows / world_size. Throws unless every member has the same number of rows, divisible by
// world_size.
template <typename T>
ModelInput<T> RankSlice(const ModelInput<T>& global, int rank, int world_size);

// RankSlice for every rank.
template <typename T>
std::vector<ModelInput<T>> SplitBatch(const ModelInput<T>& global, int world_size);

// The same input on every rank (e.g. TransformerWithSharedParams.get_input, or seq-first inputs).
template <typename T>
std::vector<ModelInput<T>> ReplicateInput(const ModelInput<T>& input, int world_size);

// Averages per-rank gradient maps (absent on a rank counts as zero there; absent everywhere
// stays absent). This is the synchronised gradient a DP step produces.
template <typename T>
TensorMap<T> AverageGradients(const std::vector<TensorMap<T>>& per_rank);

// torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type) before an optimizer step: the
// total norm of every gradient together (norm_type inf: the largest |element|), and every
// gradient scaled by min(max_norm / (total + 1e-6), 1).
struct GradClip {
  double max_norm = 1.0;   // Default: 1.
  double norm_type = 2.0;  // Default: 2; any p >= 1, or infinity.
};

template <typename T>
struct TrainingStep {
  std::vector<ModelInput<T>> rank_inputs;  // one per rank; the size is the world size
  LossSpec loss;                           // Default: SumLoss().
  bool optimizer_step = true;              // Default: true. false: accumulate gradients only.
  bool zero_grad = true;                   // Default: true (after the optimizer step).
  bool set_to_none = true;                 // Default: true (zero_grad's default).
  std::optional<GradClip> clip;            // Default: none. Applied before the optimizer step.
  // Parameters whose requires_grad is False: autograd gives them no gradient on any rank, so
  // the optimizer never steps them. Default: none.
  std::vector<std::string> frozen;
};

// One FSDP1 flat parameter, for RunDataParallelTraining's `flat_params` argument: what FSDP1
// does differently from a plain model when the flat parameter gets no gradient in a backward
// (PyTorch's _flat_param.py prepare_gradient_for_optim / _use_sharded_flat_param,
// _runtime_utils.py _post_backward_final_callback / _catch_all_reshard). A flat parameter
// that gets no gradient is taken to have run forward.
//  * `keeps_unsharded_after_forward` (SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2, or the root of any
//    sharded strategy, on a shard group of more than one rank, unless use_orig_params skipped
//    the sharded views): the unsharded flat parameter of a forward is freed only by the
//    post-backward; in a backward that gives the flat parameter no gradient it stays
//    allocated, and later forwards and summon_full_params reuse it without all-gathering
//    (`needs_unshard()` is false): they see the values of that forward, not what the optimizer
//    made of the shard since, until a backward gives it a gradient again.
//  * `full_precision_summon` (parameter mixed precision): that kept copy is the low-precision
//    one; summon_full_params all-gathers the full-precision shard into its own buffer
//    (`_full_prec_full_param_padded`), so the recorded parameters are the stepped shard while
//    forward still sees the kept copy.
//  * `offload_params` (CPUOffload(offload_params=True)): the sharded gradient lives in a
//    persistent CPU buffer (`_cpu_grad`, zeros at lazy init). A backward that gives any member
//    a gradient overwrites it with the synchronised gradient (zeros for members without one;
//    not accumulated); a backward that gives none leaves it as it was. After every synced
//    backward the buffer is `.grad`, so the optimizer keeps stepping the members with a stale
//    gradient, and zero_grad(set_to_none=False) zeroes the buffer in place.
//  * `grad_every_backward` false (with offload_params: use_orig_params where the post-forward
//    reshard skips the sharded views, SHARD_GRAD_OP and _HYBRID_SHARD_ZERO2): the optimizer
//    steps the original parameters, whose `.grad` become views into the buffer only in a
//    post-backward that reduced a gradient; otherwise they stay as the last zero_grad left
//    them: None (set_to_none=True; not stepped) or zeroed views (stepped with zeros). True: the
//    buffer is the optimizer's gradient after every backward (the flat parameter itself, or the
//    views set again by every post-forward reshard).
// Without offload_params, gradients follow the plain model's rules (a parameter without one
// keeps what the last zero_grad left).
struct Fsdp1FlatParam {
  std::vector<std::string> params;  // its original parameters' names (keys of the TensorMaps)
  bool keeps_unsharded_after_forward = false;
  bool full_precision_summon = false;
  bool offload_params = false;
  bool grad_every_backward = true;
};

template <typename T>
struct StepRecord {
  std::vector<T> rank_losses;              // loss of each rank on its own input
  std::vector<TensorMap<T>> rank_grads;    // each rank's local gradients of this backward
  TensorMap<T> grads;                      // `.grad` after this backward (averaged, accumulated)
                                           // = what the optimizer saw; before zero_grad
  TensorMap<T> params;                     // parameters after the optimizer step (with
                                           // `flat_params`: as summon_full_params sees them,
                                           // see Fsdp1FlatParam)
  std::vector<TensorMap<T>> rank_buffers;  // each rank's buffers after its forward
  double lr = 0;                           // learning rate the optimizer step used (0 when none)
  double grad_norm = 0;                    // the total norm TrainingStep::clip computed (0: none)
};

// Runs the steps in order from `params` / `buffers` (buffers start identical on every rank).
// `optimizer` may be null only if no step has optimizer_step; `scheduler` may be null. The
// scheduler steps right after each optimizer step. `flat_params`: FSDP1's flat parameters
// (Fsdp1FlatParam), each parameter in at most one; every step must then step the optimizer.
// Throws std::invalid_argument when the steps disagree on the world size or `flat_params` names
// an unknown parameter.
template <typename T>
std::vector<StepRecord<T>> RunDataParallelTraining(const Model<T>& model, TensorMap<T> params,
                                                   const TensorMap<T>& buffers,
                                                   const std::vector<TrainingStep<T>>& steps,
                                                   Optimizer<T>* optimizer,
                                                   StepLr<T>* scheduler = nullptr,
                                                   const std::vector<Fsdp1FlatParam>& flat_params = {});

// Convenience: `num_steps` identical steps, each splitting `global_batch` over `world_size` ranks
// with `loss` and zero_grad(set_to_none=True) after the optimizer step.
template <typename T>
std::vector<StepRecord<T>> RunDataParallelTraining(
    const Model<T>& model, const TensorMap<T>& params, const TensorMap<T>& buffers,
    const ModelInput<T>& global_batch, int world_size, int num_steps, const LossSpec& loss,
    Optimizer<T>* optimizer, StepLr<T>* scheduler = nullptr);

}  // namespace fsdp::reference
