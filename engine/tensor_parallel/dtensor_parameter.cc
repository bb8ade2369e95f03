#include "engine/tensor_parallel/dtensor_parameter.h"

#include <map>
#include <memory>

namespace fsdp::tensor_parallel {
namespace {

constexpr const char* kAttachment = "tensor_parallel.dtensor_parameters";
using Registry = std::map<std::string, DTensor>;

}  // namespace

void RegisterDTensorParameter(nn::Module& module, const std::string& name, const DTensor& param) {
  module.set_parameter(name, param.local_tensor());
  RecordDTensorParameter(module, name, param);
}

void RecordDTensorParameter(nn::Module& module, const std::string& name, const DTensor& param) {
  auto registry = module.attachment_as<Registry>(kAttachment);
  if (!registry) {
    registry = std::make_shared<Registry>();
    module.set_attachment(kAttachment, registry);
  }
  registry->insert_or_assign(name, param);
}

void SetParameterOrAttribute(nn::Module& module, const std::string& name, const Tensor& tensor) {
  if (module.has_parameter(name)) {
    module.set_parameter(name, tensor);
  } else {
    module.set_tensor_attribute(name, tensor);
  }
}

std::optional<DTensor> GetDTensorParameter(const nn::Module& module, const std::string& name) {
  auto registry = module.attachment_as<Registry>(kAttachment);
  if (!registry) return std::nullopt;
  auto it = registry->find(name);
  if (it == registry->end()) return std::nullopt;
  return it->second;
}

}  // namespace fsdp::tensor_parallel
