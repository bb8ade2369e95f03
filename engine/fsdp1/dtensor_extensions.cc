#include "engine/fsdp1/dtensor_extensions.h"

#include "engine/autograd/grad_mode.h"
#include "engine/core/error.h"
#include "engine/tensor_parallel/dtensor_parameter.h"

namespace fsdp::fsdp1 {

std::optional<tensor_parallel::DTensor> PreFlattenTransform(const nn::Module& module,
                                                            const std::string& name,
                                                            const Tensor& param,
                                                            const std::string& fqn) {
  std::optional<tensor_parallel::DTensor> dtensor = tensor_parallel::GetDTensorParameter(module, name);
  if (!dtensor) return std::nullopt;
  FSDP_CHECK(param.sizes() == dtensor->local_tensor().sizes(), "FSDP: parameter '", fqn,
             "' is ", dtensor->str(), " but its slot holds a tensor of shape ",
             ShapeStr(param.sizes()),
             ", not the DTensor's local tensor; FSDP flattens the TP-local pieces");
  return dtensor;
}

void PostUnflattenTransform(nn::Module& module, const std::string& name, const Tensor& view,
                            const tensor_parallel::DTensor& extension) {
  autograd::NoGradGuard no_grad;
  tensor_parallel::RecordDTensorParameter(
      module, name,
      tensor_parallel::DTensor::from_local(view, extension.device_mesh(), extension.placements(),
                                           extension.shape()));
}

}  // namespace fsdp::fsdp1
