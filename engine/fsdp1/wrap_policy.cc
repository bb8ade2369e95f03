#include "engine/fsdp1/wrap_policy.h"

#include "engine/nn/module.h"

namespace fsdp::fsdp1 {

bool ModuleWrapPolicy::operator()(const nn::Module& module, bool recurse,
                                  int64_t /*nonwrapped_numel*/) const {
  if (recurse) return true;  // always recurse
  return module_classes_.count(module.type_name()) > 0;
}

std::optional<std::vector<nn::Module*>> ModuleWrapPolicy::run_policy(
    nn::Module& root, const std::set<const nn::Module*>& ignored_modules) const {
  std::vector<nn::Module*> targets;
  for (const nn::ModulePtr& module : root.modules()) {
    if (module.get() == &root || ignored_modules.count(module.get())) continue;
    if (module_classes_.count(module->type_name())) targets.push_back(module.get());
  }
  return targets;
}

bool SizeBasedAutoWrapPolicy::operator()(const nn::Module& module, bool recurse,
                                         int64_t nonwrapped_numel) const {
  const bool is_large = nonwrapped_numel >= min_num_params_;
  if (recurse) return is_large && !force_leaf_modules_.count(module.type_name());
  return is_large && !exclude_wrap_modules_.count(module.type_name());
}

bool LambdaAutoWrapPolicy::operator()(const nn::Module& module, bool recurse,
                                      int64_t /*nonwrapped_numel*/) const {
  if (recurse) return true;  // always recurse
  return lambda_fn_(module);
}

}  // namespace fsdp::fsdp1
