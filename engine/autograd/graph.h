// torch.autograd.graph.register_multi_grad_hook: one callback for the gradients of several
// tensors, built only from ordinary tensor hooks (variable.h), so it fires at the point where
// one of those fires.
//
//  * mode "all" (register_multi_grad_hook): one tensor hook per tensor (each must require
//    grad). On the first hook call of a graph task, the number of expected calls is the
//    number of the tensors' grad_fns (AccumulateGrad for leaves) that
//    will_engine_execute_node reports; the call that reaches it runs fn(grads), with an
//    undefined entry for every tensor whose hook did not fire, inside that last tensor hook.
//  * mode "any" (register_multi_grad_hook_any): hooks on the tensors that require grad; the
//    first hook call of each graph task runs fn(grad), later ones in that task do nothing.
// Ownership: the hook state is owned by the tensor hooks; it references tensors and nodes
// weakly (no cycles). Thread-safety: per rank thread, like all hooks.
#pragma once

#include <functional>
#include <string>

#include "engine/autograd/hooks.h"
#include "engine/autograd/node.h"

namespace fsdp::autograd {

using MultiGradFn = std::function<void(const TensorList& grads)>;
using AnyGradFn = std::function<void(const Tensor& grad)>;

RemovableHandle register_multi_grad_hook(const TensorList& tensors, MultiGradFn fn);
RemovableHandle register_multi_grad_hook_any(const TensorList& tensors, AnyGradFn fn);
// The string form: mode "all" (fn gets one entry per tensor) or "any" (fn gets a one-element
// list with the first gradient). Any other mode throws "Expects mode to be one of ('all',
// 'any') but got <mode>".
RemovableHandle register_multi_grad_hook(const TensorList& tensors, MultiGradFn fn,
                                         const std::string& mode);

}  // namespace fsdp::autograd
