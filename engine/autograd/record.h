// record_function: the one entry point that differentiable operations (engine/ops/functional.h)
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
  Tensor unpack() const;
  bool defined() const { return state_ != nullptr; }

 private:
  std::shared_ptr<SavedTensorState> state_;
};
using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

TensorList record_function(const std::string& name, const TensorList& inputs, TensorList outputs,
                           BackwardFn backward);
Tensor record_function(const std::string& name, const TensorList& inputs, Tensor output,
                       BackwardFn backward);

}  // namespace fsdp::autograd
