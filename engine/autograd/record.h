// record_function: the one entry point that differentiable operations (engine/functional/functional.h)
// use to attach autograd history to the outputs of a raw kernel.
//
// When grad mode is enabled and at least one input requires grad, it creates a Node named
// `name` (taking the calling thread's next sequence number, like a PyTorch autograd node
// created for the op), with one next edge per input (gradient_edge of each input, invalid for
// inputs that need no grad), sets it as the grad_fn of every output (output_nr = position) and
// returns the outputs. Otherwise it returns the outputs untouched.
//
// At backward, `backward` receives one gradient per output, undefined ones already
// materialised as zeros of the output's shape/dtype/device, and must return one gradient per
// input (an undefined Tensor for inputs that get no gradient). Tensors needed by backward must
// be captured as SavedTensor (never as a raw Tensor): that avoids reference cycles through
// grad_fn and lets saved-tensor hooks (non-reentrant activation checkpointing) intercept them.
// The closure is destroyed by Node::release_variables after a backward without retain_graph.
// Thread-safety: like any op, called from the rank's own thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::autograd {

using TensorList = std::vector<Tensor>;

struct SavedTensorState;

// A tensor saved for backward (torch's SavedVariable). Constructing it packs the tensor,
// through the innermost active saved-tensor hooks if any (activation checkpointing drops the
// value and recomputes it on first unpack); unpack() returns the value detached from autograd.
// unpack() after the graph was released throws FailedPrecondition ("Trying to backward through
// the graph a second time ..." as PyTorch words it).
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& tensor);
  // keep_history=true (PyTorch's SavedVariable for a non-output, used by custom Function
  // inputs and the checkpoint input saver): without saved-tensor hooks the tensor itself is
  // kept and unpack() returns it with its autograd history; with hooks, unpack() returns the
  // unpack hook's value with the history re-attached (the original grad_fn and output_nr, or
  // requires_grad for a leaf), as SavedVariable does.
  SavedTensor(const Tensor& tensor, bool keep_history);
  Tensor unpack() const;
  bool defined() const { return state_ != nullptr; }
  // Frees the saved value (every copy shares it); a later unpack() throws.
  void release();

 private:
  std::shared_ptr<SavedTensorState> state_;
};
using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

// The message PyTorch raises when a released graph is used again.
extern const char kBackwardTwiceMessage[];

// True when record_function would record history for `inputs` (grad mode on and an input
// requires grad). Ops must build their SavedTensors only in that case: a SavedTensor built
// otherwise still goes through the saved-tensor hooks (a checkpoint region would count it).
bool compute_requires_grad(const TensorList& inputs);

// Details beyond the summary above:
//  * if no grad_output is defined, `backward` is not called and every input gets an
//    undefined gradient (PyTorch's generated formulas do the same), so "no gradient" reaches
//    AccumulateGrad as undefined and leaves .grad untouched;
//  * outputs that are not floating point get no grad_fn (non-differentiable);
//  * an output that is one of the inputs is an in-place op: it gets the new node as its
//    grad_fn (edges were taken first), its tensor hooks stay on the old node and its
//    retains-grad hook moves; a leaf that requires grad cannot be modified in place;
//  * an output that already carries autograd history is replaced by a detached alias.
TensorList record_function(const std::string& name, const TensorList& inputs, TensorList outputs,
                           BackwardFn backward);
Tensor record_function(const std::string& name, const TensorList& inputs, Tensor output,
                       BackwardFn backward);

}  // namespace fsdp::autograd
