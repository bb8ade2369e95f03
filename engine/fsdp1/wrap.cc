#include "engine/fsdp1/wrap.h"

#include <map>
#include <optional>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/rank_context.h"

namespace fsdp::fsdp1 {
namespace {

// `_ConfigAutoWrap`: the options of the rank's enable_wrap scope, if any.
struct AutoWrapConfig {
  std::optional<FullyShardedDataParallelOptions> options;
};

AutoWrapConfig& CurrentAutoWrapConfig() { return RankContext::Current().slot<AutoWrapConfig>(); }

// `_check_nested_wrapping`.
void CheckNestedWrapping(const nn::Module& root_module) {
  for (const auto& [name, module] : root_module.named_modules()) {
    FSDP_CHECK(AsFsdp(*module) == nullptr,
               "FSDP auto wrapping requires modules to not already have FSDP applied but found ",
               name.empty() ? std::string("the root module") : name, " in\n", root_module.repr());
  }
}

// `_post_order_apply`: fn on every module below `module` (children before parents, each once);
// a non-null result replaces the module in its parent.
void PostOrderApply(const nn::ModulePtr& module, std::set<const nn::Module*>* visited,
                    const std::function<nn::ModulePtr(const nn::ModulePtr&)>& fn) {
  for (const auto& [name, child] : module->named_children()) {
    if (!visited->insert(child.get()).second) continue;
    PostOrderApply(child, visited, fn);
    if (nn::ModulePtr wrapped = fn(child)) module->register_module(name, wrapped);
  }
}

// `_recursive_wrap(module, policy, only_wrap_children)`: returns the (possibly wrapped) module
// and the number of parameters wrapped.
std::pair<nn::ModulePtr, int64_t> RecursiveWrap(
    const nn::ModulePtr& module, const AutoWrapPolicy& policy,
    const std::set<const nn::Module*>& ignored_modules,
    const std::set<const TensorImpl*>& ignored_params,
    const FullyShardedDataParallelOptions& options, bool only_wrap_children) {
  // All parameters count as not wrapped yet.
  int64_t nonwrapped_numel = 0;
  for (const Tensor& p : module->parameters()) {
    if (!ignored_params.count(p.impl())) nonwrapped_numel += p.numel();
  }
  if (!policy(*module, /*recurse=*/true, nonwrapped_numel)) return {module, 0};
  int64_t total_wrapped_numel = 0;
  for (const auto& [name, child] : module->named_children()) {
    if (ignored_modules.count(child.get())) continue;
    auto [wrapped_child, num_wrapped_params] = RecursiveWrap(
        child, policy, ignored_modules, ignored_params, options, /*only_wrap_children=*/false);
    if (wrapped_child != child) module->register_module(name, wrapped_child);
    total_wrapped_numel += num_wrapped_params;
  }
  const int64_t remainder = nonwrapped_numel - total_wrapped_numel;
  if (!only_wrap_children && policy(*module, /*recurse=*/false, remainder)) {
    return {std::make_shared<FullyShardedDataParallel>(module, options), nonwrapped_numel};
  }
  return {module, total_wrapped_numel};
}

}  // namespace

void AutoWrap(const nn::ModulePtr& root_module, const AutoWrapPolicy& policy,
              const std::set<const nn::Module*>& ignored_modules,
              const std::set<const TensorImpl*>& ignored_params,
              const FullyShardedDataParallelOptions& root_options) {
  CheckNestedWrapping(*root_module);
  if (std::optional<std::vector<nn::Module*>> targets =
          policy.run_policy(*root_module, ignored_modules)) {
    const std::set<const nn::Module*> target_set(targets->begin(), targets->end());
    std::set<const nn::Module*> visited = {root_module.get()};
    PostOrderApply(root_module, &visited, [&](const nn::ModulePtr& module) -> nn::ModulePtr {
      if (!target_set.count(module.get()) || module == root_module) return nullptr;
      return std::make_shared<FullyShardedDataParallel>(module, root_options);
    });
    return;
  }
  RecursiveWrap(root_module, policy, ignored_modules, ignored_params, root_options,
                /*only_wrap_children=*/true);
}

EnableWrap::EnableWrap(FullyShardedDataParallelOptions options) {
  AutoWrapConfig& config = CurrentAutoWrapConfig();
  FSDP_CHECK(!config.options.has_value(),
             "You are already within an autowrap context and we currently do not supported "
             "nested autowrap.");
  config.options = std::move(options);
}

EnableWrap::~EnableWrap() { CurrentAutoWrapConfig().options.reset(); }

nn::ModulePtr wrap(const nn::ModulePtr& module,
                   const std::function<void(FullyShardedDataParallelOptions&)>& overrides) {
  const AutoWrapConfig& config = CurrentAutoWrapConfig();
  if (!config.options.has_value()) return module;
  FullyShardedDataParallelOptions options = *config.options;
  if (overrides) overrides(options);
  return std::make_shared<FullyShardedDataParallel>(module, options);
}

}  // namespace fsdp::fsdp1
