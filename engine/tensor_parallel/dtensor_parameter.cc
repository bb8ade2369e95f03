#include "engine/tensor_parallel/dtensor_parameter.h"

#include <map>
#include <memory>

namespace fsdp::tensor_parallel {
namespace {

constexpr const char* kAttachment = "tensor_parallel.dtensor_parameters";
using Registry = std::map<std::string, DTensor>;

}  // namespace

void RegisterDTensorParameter(nn::Module& module, const std::string& name, const DTensor& param) {
  auto registry = module.attachment_as<Registry>(kAttachment);
  if (!registry) {
    registry = std::make_shared<Registry>();
    module.set_attachment(kAttachment, registry);
  }
  module.set_parameter(name, param.local_tensor());
  registry->insert_or_assign(name, param);
}

std::optional<DTensor> GetDTensorParameter(const nn::Module& module, const std::string& name) {
  auto registry = module.attachment_as<Registry>(kAttachment);
  if (!registry) return std::nullopt;
  auto it = registry->find(name);
  if (it == registry->end()) return std::nullopt;
  return it->second;
}

}  // namespace fsdp::tensor_parallel
