// Tensor's autograd members (declared in engine/core/tensor.h) and the tensor-level
// functions of variable.h.
#include "engine/autograd/variable.h"

#include "engine/autograd/accumulate_grad.h"
#include "engine/autograd/engine.h"
#include "engine/autograd/grad_kernels.h"

namespace fsdp {

using autograd::AutogradMeta;
using autograd::get_autograd_meta;
using autograd::materialize_autograd_meta;

bool Tensor::requires_grad() const {
  const AutogradMeta* meta = get_autograd_meta(*this);
  return meta != nullptr && (meta->requires_grad || meta->grad_fn != nullptr);
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  FSDP_CHECK(defined(), "set_requires_grad on an undefined tensor");
  if (!is_leaf()) {
    // requires_grad_(True) on a non-leaf is a no-op, as in PyTorch.
    FSDP_CHECK(requires_grad,
               "you can only change requires_grad flags of leaf variables. If you want to use a "
               "computed variable in a subgraph that doesn't require differentiation use "
               "var_no_grad = var.detach().");
    return *this;
  }
  FSDP_CHECK(!requires_grad || IsFloatingPoint(dtype()),
             "only Tensors of floating point dtype can require gradients (got ",
             DTypeName(dtype()), ")");
  if (!requires_grad && get_autograd_meta(*this) == nullptr) return *this;
  materialize_autograd_meta(*this).requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  const AutogradMeta* meta = get_autograd_meta(*this);
  return meta != nullptr ? meta->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  FSDP_CHECK(defined(), "set_grad on an undefined tensor");
  if (!grad.defined()) {
    if (AutogradMeta* meta = get_autograd_meta(*this)) meta->grad = Tensor();
    return;
  }
  FSDP_CHECK(grad.dtype() == dtype(), "attempting to assign a gradient with dtype '",
             DTypeName(grad.dtype()), "' to a tensor with dtype '", DTypeName(dtype()),
             "'. Please ensure that the gradient and the tensor have the same dtype");
  FSDP_CHECK(grad.device() == device(), "attempting to assign a gradient with device '",
             grad.device().str(), "' to a tensor with device '", device().str(),
             "'. Please ensure that the gradient and the tensor are on the same device");
  FSDP_CHECK(grad.sizes() == sizes(), "attempting to assign a gradient of size '",
             ShapeStr(grad.sizes()), "' to a tensor of size '", ShapeStr(sizes()),
             "'. Please ensure that the gradient and the tensor are the same size");
  materialize_autograd_meta(*this).grad = grad;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  const AutogradMeta* meta = get_autograd_meta(*this);
  return meta != nullptr ? meta->grad_fn : nullptr;
}

bool Tensor::is_leaf() const { return grad_fn() == nullptr; }

uint32_t Tensor::output_nr() const {
  const AutogradMeta* meta = get_autograd_meta(*this);
  return meta != nullptr ? meta->output_nr : 0;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>(checked());
  impl->autograd_meta.reset();
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

namespace autograd {

AutogradMeta* get_autograd_meta(const Tensor& tensor) {
  if (!tensor.defined()) return nullptr;
  return tensor.impl()->autograd_meta.get();
}

AutogradMeta& materialize_autograd_meta(const Tensor& tensor) {
  FSDP_CHECK(tensor.defined(), "autograd: operation on an undefined tensor");
  auto& meta = tensor.impl()->autograd_meta;
  if (!meta) meta = std::make_shared<AutogradMeta>();
  return *meta;
}

Edge gradient_edge(const Tensor& tensor) {
  const AutogradMeta* meta = get_autograd_meta(tensor);
  if (meta == nullptr) return Edge();
  if (meta->grad_fn) return Edge(meta->grad_fn, meta->output_nr);
  if (meta->requires_grad) return Edge(grad_accumulator(tensor), 0);
  return Edge();
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta* meta = get_autograd_meta(leaf);
  if (meta == nullptr || !meta->requires_grad) return nullptr;
  FSDP_CHECK_CODE(ErrorCode::kInternal, meta->grad_fn == nullptr,
                  "grad_accumulator() should be only called on leaf Variables");
  if (auto existing = meta->grad_accumulator.lock()) return existing;
  auto node = std::make_shared<AccumulateGrad>(leaf);
  meta->grad_accumulator = node;
  return node;
}

std::shared_ptr<Node> try_get_grad_accumulator(const Tensor& tensor) {
  const AutogradMeta* meta = get_autograd_meta(tensor);
  return meta != nullptr ? meta->grad_accumulator.lock() : nullptr;
}

void set_gradient_edge(const Tensor& tensor, const Edge& edge) {
  AutogradMeta& meta = materialize_autograd_meta(tensor);
  std::shared_ptr<Node> old_fn = meta.grad_fn;
  const uint32_t old_output_nr = meta.output_nr;
  meta.grad_fn = edge.function;
  meta.output_nr = edge.input_nr;
  if (old_fn && edge.function && old_fn != edge.function) {
    meta.hooks = nullptr;
    if (meta.retains_grad) {
      GradientsHook hook = old_fn->pop_retains_grad_hook(old_output_nr);
      if (hook) edge.function->add_retains_grad_hook(std::move(hook), edge.input_nr);
    }
  }
}

GradientsHook MakeTensorHooksAdaptor(std::shared_ptr<HookList<TensorHook>> hooks,
                                     uint32_t value_index) {
  return [hooks = std::move(hooks), value_index](TensorList grads) {
    FSDP_INTERNAL_ASSERT(value_index < grads.size());
    for (const TensorHook& hook : hooks->snapshot()) {
      Tensor result = hook(grads[value_index]);
      if (result.defined()) grads[value_index] = std::move(result);
    }
    return grads;
  };
}

RemovableHandle add_tensor_hook(const Tensor& tensor, TensorHook hook) {
  FSDP_CHECK(tensor.defined(), "register_hook on an undefined tensor");
  FSDP_CHECK(tensor.requires_grad(),
             "cannot register a hook on a tensor that doesn't require gradient");
  AutogradMeta& meta = materialize_autograd_meta(tensor);
  if (!meta.hooks) {
    meta.hooks = std::make_shared<HookList<TensorHook>>();
    if (meta.grad_fn) meta.grad_fn->add_tensor_pre_hook(MakeTensorHooksAdaptor(meta.hooks, meta.output_nr));
  }
  return AddRemovableHook(meta.hooks, std::move(hook));
}

void retain_grad(const Tensor& tensor) {
  FSDP_CHECK(tensor.defined(), "retain_grad on an undefined tensor");
  FSDP_CHECK(tensor.requires_grad(), "can't retain_grad on Tensor that has requires_grad=False");
  if (tensor.is_leaf()) return;
  AutogradMeta& meta = materialize_autograd_meta(tensor);
  if (meta.retains_grad) return;
  std::weak_ptr<TensorImpl> weak_self = tensor.impl_ptr();
  const uint32_t output_nr = meta.output_nr;
  GradientsHook hook = [weak_self](TensorList grads) {
    std::shared_ptr<TensorImpl> self = weak_self.lock();
    if (!self) return grads;
    // The slot is read at call time: an in-place op may have moved the hook to a new node.
    AutogradMeta& self_meta = materialize_autograd_meta(Tensor(self));
    const Tensor& grad = grads.at(self_meta.output_nr);
    if (!grad.defined()) return grads;
    if (!self_meta.grad.defined()) {
      self_meta.grad = kernels::Clone(grad);
    } else {
      self_meta.grad = kernels::Add(self_meta.grad, grad);
    }
    return grads;
  };
  meta.grad_fn->add_retains_grad_hook(std::move(hook), output_nr);
  meta.retains_grad = true;
}

bool retains_grad(const Tensor& tensor) {
  const AutogradMeta* meta = get_autograd_meta(tensor);
  return meta != nullptr && meta->retains_grad;
}

RemovableHandle register_post_accumulate_grad_hook(const Tensor& tensor,
                                                   PostAccumulateGradHook hook) {
  FSDP_CHECK(tensor.defined(), "register_post_accumulate_grad_hook on an undefined tensor");
  FSDP_CHECK(tensor.is_leaf(), "post accumulate grad hooks cannot be registered on non-leaf tensors");
  AutogradMeta& meta = materialize_autograd_meta(tensor);
  if (!meta.post_accumulate_grad_hooks) {
    meta.post_accumulate_grad_hooks = std::make_shared<HookList<PostAccumulateGradHook>>();
  }
  return AddRemovableHook(meta.post_accumulate_grad_hooks, std::move(hook));
}

void zero_grad(const Tensor& param, bool set_to_none) {
  Tensor g = param.grad();
  if (!g.defined()) return;
  if (set_to_none) {
    param.set_grad(Tensor());
  } else {
    g.zero_();
  }
}

}  // namespace autograd
}  // namespace fsdp
