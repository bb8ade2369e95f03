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
// input (an undefined Tensor for inputs that get no gradient). Saved tensors must be captured
// DETACHED (x.detach()) so no reference cycle forms through grad_fn; the closure is destroyed
// by Node::release_variables after a backward without retain_graph.
// Thread-safety: like any op, called from the rank's own thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::autograd {

using TensorList = std::vector<Tensor>;
using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

TensorList record_function(const std::string& name, const TensorList& inputs, TensorList outputs,
                           BackwardFn backward);
Tensor record_function(const std::string& name, const TensorList& inputs, Tensor output,
                       BackwardFn backward);

}  // namespace fsdp::autograd
