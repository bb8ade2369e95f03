#include "conformance/tp_models.h"

#include "engine/autograd/grad_mode.h"
#include "engine/nn/models.h"
#include "engine/tensor_parallel/dtensor.h"
#include "engine/tensor_parallel/dtensor_parameter.h"

namespace fsdp::conformance {

TpExtensionModel::TpExtensionModel() : nn::Module("TestModel") {
  register_module("mlp", std::make_shared<nn::MLPModule>());
  register_module("mlp_norm", std::make_shared<nn::RMSNormPython>(10));
}

nn::Value TpExtensionModel::forward(const nn::Value& x) {
  return call_child("mlp", call_child("mlp_norm", x));
}

nn::ModulePtr MakeSyncStateModel(const Tensor& param, const Tensor& buf,
                                 const std::shared_ptr<distributed::DeviceMesh>& tp_mesh) {
  auto model = std::make_shared<nn::Module>("TestModel");
  // nn.Parameter(DTensor.from_local(...)): a leaf parameter whose DTensor is recorded beside it.
  const Tensor leaf = model->register_parameter("param", param);
  autograd::NoGradGuard no_grad;
  tensor_parallel::RecordDTensorParameter(
      *model, "param",
      tensor_parallel::DTensor::from_local(leaf, tp_mesh, {tensor_parallel::Placement::Replicate()}));
  model->register_buffer("buf", buf);
  return model;
}

}  // namespace fsdp::conformance
