#include "engine/tensor_parallel/parallelize_module.h"

#include <sstream>

#include "engine/core/error.h"

namespace fsdp::tensor_parallel {

nn::Module& parallelize_module(nn::Module& module,
                               const std::shared_ptr<distributed::DeviceMesh>& device_mesh,
                               const ParallelizePlan& parallelize_plan) {
  FSDP_CHECK(device_mesh != nullptr, "parallelize_module: device_mesh is null");
  FSDP_CHECK(device_mesh->ndim() == 1, "parallelize_module: the TP device_mesh must be 1-D, got ",
             device_mesh->str(), "; pass a 1-D submesh such as mesh_2d[\"tp\"]");
  // Resolve every FQN before applying anything.
  std::vector<std::pair<nn::Module*, const ParallelStyle*>> targets;
  for (const auto& [fqn, style] : parallelize_plan) {
    FSDP_CHECK(style != nullptr, "parallelize_module: the plan entry '", fqn, "' has no style");
    nn::Module* target = &module;
    if (!fqn.empty()) {
      const auto named = module.named_modules();
      target = nullptr;
      for (const auto& [name, m] : named) {
        if (name == fqn) target = m.get();
      }
      if (target == nullptr) {
        std::ostringstream known;
        for (const auto& [name, m] : named) known << " '" << name << "'";
        FSDP_CHECK(false, "parallelize_module: the plan names '", fqn, "' (", style->str(),
                   "), which is not a submodule of ", module.type_name(),
                   "; its modules are:", known.str());
      }
    }
    targets.emplace_back(target, style.get());
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i].second->apply(*targets[i].first, device_mesh, parallelize_plan[i].first);
  }
  return module;
}

}  // namespace fsdp::tensor_parallel
