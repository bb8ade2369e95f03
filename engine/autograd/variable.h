// Per-tensor autograd state (AutogradMeta) and the tensor-level autograd functions that are
// not Tensor members: gradient_edge, the cached AccumulateGrad of a leaf, tensor hooks
// (Tensor.register_hook), retain_grad, post-accumulate-grad hooks, and zeroing a .grad.
//
// The Tensor members declared in engine/core/tensor.h (requires_grad, grad, grad_fn,
// backward, ...) are implemented in variable.cc on top of this state.
//
// Ownership: a TensorImpl owns its AutogradMeta (created on first need). The meta owns its
// grad_fn strongly and its AccumulateGrad weakly (graphs own it; when every graph using a
// leaf is gone the node dies and the next forward builds a new one, as in PyTorch).
// Thread-safety: none; a rank's tensors are used by its thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "engine/autograd/hooks.h"
#include "engine/autograd/node.h"
#include "engine/core/tensor.h"

namespace fsdp::autograd {

// A tensor hook: called with the gradient of the tensor (undefined = None); a defined return
// value replaces it, an undefined one keeps it.
using TensorHook = std::function<Tensor(const Tensor& grad)>;
// A post-accumulate-grad hook: called with the leaf tensor itself after its .grad changed.
using PostAccumulateGradHook = std::function<void(const Tensor& tensor)>;

// The autograd state of one TensorImpl (torch::autograd::AutogradMeta).
struct AutogradMeta {
  // Set by set_requires_grad on leaves; non-leaves require grad through their grad_fn.
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  std::weak_ptr<Node> grad_accumulator;
  uint32_t output_nr = 0;
  bool retains_grad = false;
  // The tensor's register_hook hooks (Python's _backward_hooks dict). Non-leaf: the grad_fn
  // holds one adaptor entry over this list; leaf: AccumulateGrad reads it live. Reset when
  // the tensor gets a new grad_fn (in-place), so older hooks stay on the old node.
  std::shared_ptr<HookList<TensorHook>> hooks;
  std::shared_ptr<HookList<PostAccumulateGradHook>> post_accumulate_grad_hooks;
};

// Null when the tensor has no autograd state.
AutogradMeta* get_autograd_meta(const Tensor& tensor);
AutogradMeta& materialize_autograd_meta(const Tensor& tensor);

// (grad_fn, output_nr) for a non-leaf, (AccumulateGrad, 0) for a leaf that requires grad,
// an invalid edge otherwise (and for undefined tensors).
Edge gradient_edge(const Tensor& tensor);
// The leaf's AccumulateGrad: the cached one while any graph keeps it alive, else a new one.
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);
// The cached AccumulateGrad if alive, without creating one.
std::shared_ptr<Node> try_get_grad_accumulator(const Tensor& tensor);
// Makes `edge` the tensor's history: grad_fn = edge.function, output_nr = edge.input_nr.
// When the tensor already had a grad_fn (an in-place op), its tensor hooks stay on the old
// node and its retains-grad hook moves to the new one (update_tensor_hooks_on_new_gradfn).
void set_gradient_edge(const Tensor& tensor, const Edge& edge);

// The GradientsHook that runs the hooks of `hooks` on slot `value_index`, in order.
GradientsHook MakeTensorHooksAdaptor(std::shared_ptr<HookList<TensorHook>> hooks,
                                     uint32_t value_index);

// Tensor.register_hook(fn). `fn(grad)` may return void, Tensor or std::optional<Tensor>.
// The tensor must require grad ("cannot register a hook on a tensor that doesn't require
// gradient"). On a non-leaf it fires when the engine pops grad_fn, once, with the summed
// gradient; on a leaf it fires before its AccumulateGrad's node pre-hooks.
RemovableHandle add_tensor_hook(const Tensor& tensor, TensorHook hook);
template <typename F>
RemovableHandle register_hook(const Tensor& tensor, F&& fn) {
  using R = std::invoke_result_t<F&, const Tensor&>;
  if constexpr (std::is_void_v<R>) {
    return add_tensor_hook(tensor, [fn = std::forward<F>(fn)](const Tensor& grad) mutable {
      fn(grad);
      return Tensor();
    });
  } else if constexpr (std::is_same_v<std::decay_t<R>, std::optional<Tensor>>) {
    return add_tensor_hook(tensor, [fn = std::forward<F>(fn)](const Tensor& grad) mutable {
      std::optional<Tensor> result = fn(grad);
      return result ? *result : Tensor();
    });
  } else {
    return add_tensor_hook(tensor, TensorHook(std::forward<F>(fn)));
  }
}

// Tensor.retain_grad(): a no-op on leaves; on a non-leaf, installs the retains-grad hook
// (first backward: .grad = clone(grad); later ones: .grad = .grad + grad, out of place).
void retain_grad(const Tensor& tensor);
bool retains_grad(const Tensor& tensor);

// Tensor.register_post_accumulate_grad_hook(fn): leaf only; fn(leaf) runs inside its
// AccumulateGrad after .grad was updated, in registration order.
RemovableHandle register_post_accumulate_grad_hook(const Tensor& tensor,
                                                   PostAccumulateGradHook hook);

// The per-parameter step of nn.Module.zero_grad and Optimizer.zero_grad (one implementation
// for both): a defined .grad becomes None (set_to_none) or is zeroed in place; a parameter
// without .grad is left alone.
void zero_grad(const Tensor& param, bool set_to_none);

}  // namespace fsdp::autograd
