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

template <typename T>
struct TrainingStep {
  std::vector<ModelInput<T>> rank_inputs;  // one per rank; the size is the world size
  LossSpec loss;                           // Default: SumLoss().
  bool optimizer_step = true;              // Default: true. false: accumulate gradients only.
  bool zero_grad = true;                   // Default: true (after the optimizer step).
  bool set_to_none = true;                 // Default: true (zero_grad's default).
};

template <typename T>
struct StepRecord {
  std::vector<T> rank_losses;              // loss of each rank on its own input
  std::vector<TensorMap<T>> rank_grads;    // each rank's local gradients of this backward
  TensorMap<T> grads;                      // `.grad` after this backward (averaged, accumulated)
                                           // = what the optimizer saw; before zero_grad
  TensorMap<T> params;                     // parameters after the optimizer step
  std::vector<TensorMap<T>> rank_buffers;  // each rank's buffers after its forward
  double lr = 0;                           // learning rate the optimizer step used (0 when none)
};

// Runs the steps in order from `params` / `buffers` (buffers start identical on every rank).
// `optimizer` may be null only if no step has optimizer_step; `scheduler` may be null. The
// scheduler steps right after each optimizer step. Throws std::invalid_argument when the steps
// disagree on the world size.
template <typename T>
std::vector<StepRecord<T>> RunDataParallelTraining(const Model<T>& model, TensorMap<T> params,
                                                   const TensorMap<T>& buffers,
                                                   const std::vector<TrainingStep<T>>& steps,
                                                   Optimizer<T>* optimizer,
                                                   StepLr<T>* scheduler = nullptr);

// Convenience: `num_steps` identical steps, each splitting `global_batch` over `world_size` ranks
// with `loss` and zero_grad(set_to_none=True) after the optimizer step.
template <typename T>
std::vector<StepRecord<T>> RunDataParallelTraining(
    const Model<T>& model, const TensorMap<T>& params, const TensorMap<T>& buffers,
    const ModelInput<T>& global_batch, int world_size, int num_steps, const LossSpec& loss,
    Optimizer<T>* optimizer, StepLr<T>* scheduler = nullptr);

}  // namespace fsdp::reference
