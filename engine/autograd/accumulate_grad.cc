#include "engine/autograd/accumulate_grad.h"

#include <cstdint>

#include "engine/autograd/grad_kernels.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/variable.h"

namespace fsdp::autograd {

AccumulateGrad::AccumulateGrad(Tensor variable)
    : Node(/*sequence_nr=*/UINT64_MAX, {}), variable_(std::move(variable)) {
  add_input_metadata(variable_);
}

std::vector<GradientsHook> AccumulateGrad::tensor_pre_hooks() const {
  AutogradMeta* meta = get_autograd_meta(variable_);
  if (meta == nullptr || !meta->hooks || meta->hooks->empty()) return {};
  return {MakeTensorHooksAdaptor(meta->hooks, 0)};
}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  FSDP_INTERNAL_ASSERT(grads.size() == 1, "AccumulateGrad got ", grads.size(), " gradients");
  if (!grads[0].defined()) return {};
  FSDP_CHECK_CODE(ErrorCode::kInternal, variable_.grad_fn() == nullptr,
                  "leaf variable has been moved into the graph interior");
  if (!variable_.requires_grad()) return {};

  Tensor new_grad = std::move(grads[0]);
  AutogradMeta& meta = materialize_autograd_meta(variable_);
  // The engine keeps one extra reference to the inputs while post hooks are registered.
  const long expected_refs = 1 + (has_post_hooks() ? 1 : 0);
  if (!meta.grad.defined()) {
    const bool exclusive = new_grad.impl_ptr().use_count() <= expected_refs &&
                           new_grad.storage().use_count() == 1;
    if (!GradMode::is_enabled() && exclusive) {
      // Steal: nothing else can observe the tensor.
      meta.grad = new_grad.impl()->autograd_meta ? new_grad.detach() : std::move(new_grad);
    } else {
      meta.grad = kernels::Clone(new_grad);
    }
  } else if (!GradMode::is_enabled()) {
    kernels::AddInPlace(meta.grad, new_grad);
  } else {
    meta.grad = kernels::Add(meta.grad, new_grad);
  }

  if (meta.post_accumulate_grad_hooks) {
    for (const PostAccumulateGradHook& hook : meta.post_accumulate_grad_hooks->snapshot()) {
      hook(variable_);
    }
  }
  return {};
}

}  // namespace fsdp::autograd
