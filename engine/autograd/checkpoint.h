// Non-reentrant activation checkpointing (torch.utils.checkpoint with use_reentrant=False),
// built on saved-tensor hooks, plus the region object the module-level wrappers need
// (utils checkpoint_wrapper / CheckpointWrapper, and composable checkpoint(module), whose
// forward pre-hook enters a region and whose forward hook exits it).
//
// Forward (CheckpointRegion constructor, i.e. _checkpoint_without_reentrant_generator):
//  1. the current RankContext generator's full state (seed, offset, buffered words) is
//     copied when preserve_rng_state;
//  2. a leaf `dummy` (empty, requires grad) and the region's inputs go through a custom
//     Function "_NoopSaveInputsBackward" that saves the inputs (real saves, or an outer
//     region's holders when nested). It creates ONE extra node, which takes a sequence
//     number and never runs (its output is unused);
//  3. with grad mode off nothing else happens; otherwise the region's (pack, unpack) pair is
//     pushed: every tensor saved inside the region (activations and parameters) is replaced
//     by an empty holder, and its shape/dtype/device is recorded. The graph's nodes, edges
//     and numbering are otherwise exactly those of the uncheckpointed forward.
// exit() (or the destructor) pops the pair and marks the forward completed.
//
// Backward: recompute happens INSIDE the apply of the first node of the region that unpacks
// a saved tensor in the current graph task, i.e. when the highest-numbered region node that
// has saved tensors runs, after that node's tensor hooks and node pre-hooks and before its
// backward formula computes anything. Nodes without saved tensors run without recomputing.
// The recompute reads the inputs back from the input saver, pushes the recomputation pack
// hook, enables grad, restores the saved generator state (the ambient generator is restored
// afterwards), sets is_recomputing(), and calls recompute_fn(inputs). Each save during
// recompute is cached (detached) in the matching holder, in order. With early_stop, the save
// that completes the count throws StopRecomputationError out of the op, which ends the
// recompute (the rest of the function does not run). Counts and metadata are then checked.
// Each holder's cached tensor is handed out once per graph task and dropped. Another
// backward (another graph task id) recomputes again; outside a backward every unpack gets a
// fresh id. Nodes built during recompute take later sequence numbers, belong to no graph
// task and are thrown away: the engine's order is untouched.
//
// Ownership: a region's frame is shared by the holders' unpack closures and the region; the
// frame owns the input saver node (and through it the saved inputs) and recompute_fn.
// Thread-safety: a region is entered, exited and recomputed on one (rank) thread.
#pragma once

#include <exception>
#include <functional>
#include <memory>

#include "engine/autograd/node.h"
#include "engine/autograd/saved_tensor_hooks.h"

namespace fsdp::autograd {

struct CheckpointOptions {
  // Restore the generator state for the recompute (dropout masks match). Default: true.
  bool preserve_rng_state = true;
  // Stop the recompute once every saved tensor was recomputed. Default: true.
  bool early_stop = true;
  // Compare shape/dtype/device of recomputed tensors with the forward's. Default: true.
  bool determinism_check = true;
};

// Thrown from the recomputation pack hook to end a recompute early; caught by the unpack
// that started it. Not an fsdp::Error: code between the op and the unpack (modules, hooks)
// must let it pass (running only always-call hooks, like Python's _StopRecomputationError).
class StopRecomputationError : public std::exception {
 public:
  const char* what() const noexcept override { return "checkpoint recomputation stopped early"; }
};

// True while this thread runs a checkpoint recompute (forward hooks can tell a recompute
// from the original forward).
bool is_recomputing();

struct CheckpointFrame;

// One checkpointed region: constructing it enters the region (steps 1-3 above), exit() or the
// destructor leaves it. The function form and both module wrappers are built on it.
class CheckpointRegion {
 public:
  // Called at recompute with the region's inputs as saved at entry (the original tensors,
  // with their autograd history). Its outputs are discarded.
  using RecomputeFn = std::function<void(const TensorList& inputs)>;

  CheckpointRegion(RecomputeFn recompute_fn, const TensorList& inputs,
                   const CheckpointOptions& options = {});
  ~CheckpointRegion();
  CheckpointRegion(const CheckpointRegion&) = delete;
  CheckpointRegion& operator=(const CheckpointRegion&) = delete;

  // Leaves the region (pops its saved-tensor hooks). Must be called on the entering thread
  // with the region's hooks innermost. Idempotent.
  void exit();
  // False when grad mode was off at entry (nothing is checkpointed).
  bool hooks_active() const { return hooks_ != nullptr; }

 private:
  std::shared_ptr<CheckpointFrame> frame_;
  std::shared_ptr<SavedTensorHooks> hooks_;
  bool exited_ = false;
};

// torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False).
TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn,
                      const TensorList& inputs, const CheckpointOptions& options = {});

}  // namespace fsdp::autograd
