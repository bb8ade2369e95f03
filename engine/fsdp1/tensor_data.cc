#include "engine/fsdp1/tensor_data.h"

#include "engine/autograd/variable.h"

namespace fsdp::fsdp1 {

void SetData(const Tensor& tensor, const Tensor& src) {
  TensorImpl* impl = tensor.impl();
  impl->storage = src.storage();
  impl->storage_offset = src.storage_offset();
  impl->sizes = src.sizes();
  impl->dtype = src.dtype();
}

void SetGradUnchecked(const Tensor& tensor, const Tensor& grad) {
  if (!grad.defined()) {
    if (autograd::AutogradMeta* meta = autograd::get_autograd_meta(tensor)) meta->grad = Tensor();
    return;
  }
  autograd::materialize_autograd_meta(tensor).grad = grad;
}

}  // namespace fsdp::fsdp1
