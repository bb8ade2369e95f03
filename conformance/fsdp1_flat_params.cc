#include "conformance/fsdp1_flat_params.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "conformance/sharded_parity.h"
#include "engine/fsdp1/wrap_policy.h"

namespace fsdp::conformance {

std::shared_ptr<fsdp1::FullyShardedDataParallel> WrapChildrenThenRoot(
    const nn::ModulePtr& module, fsdp1::FullyShardedDataParallelOptions options,
    std::optional<fsdp1::ShardingStrategy> first_child_strategy) {
  if (first_child_strategy) {
    // Each child's parent and its name there, to replace it with its FSDP instance.
    std::map<const nn::Module*, std::pair<nn::ModulePtr, std::string>> parents;
    for (const auto& [name, m] : module->named_modules()) {
      for (const auto& [child_name, child] : m->named_children()) {
        parents[child.get()] = {m, child_name};
      }
    }
    options.auto_wrap_policy = nullptr;
    bool first = true;
    for (const nn::ModulePtr& child : ChildrenToShard(module)) {
      fsdp1::FullyShardedDataParallelOptions child_options = options;
      if (first) child_options.sharding_strategy = *first_child_strategy;
      first = false;
      const auto& [parent, child_name] = parents.at(child.get());
      parent->register_module(
          child_name, std::make_shared<fsdp1::FullyShardedDataParallel>(child, child_options));
    }
    return std::make_shared<fsdp1::FullyShardedDataParallel>(module, std::move(options));
  }
  std::set<const nn::Module*> nested;
  for (const nn::ModulePtr& child : ChildrenToShard(module)) nested.insert(child.get());
  options.auto_wrap_policy = std::make_shared<fsdp1::LambdaAutoWrapPolicy>(
      [nested](const nn::Module& m) { return nested.count(&m) > 0; });
  return std::make_shared<fsdp1::FullyShardedDataParallel>(module, std::move(options));
}

std::vector<Fsdp1FlatParamFqns> Fsdp1FlatParamsOf(const ZooModel& model) {
  const nn::ModulePtr module = model.BuildEngine();
  std::map<const nn::Module*, std::string> fqns;
  for (const auto& [name, m] : module->named_modules()) fqns[m.get()] = name;
  std::vector<Fsdp1FlatParamFqns> out;
  std::set<std::string> nested_params;
  for (const nn::ModulePtr& child : ChildrenToShard(module)) {
    std::vector<std::string> flat;
    for (const auto& [name, p] : child->named_parameters(fqns.at(child.get()))) {
      flat.push_back(name);
      nested_params.insert(name);
    }
    if (!flat.empty()) out.push_back({std::move(flat), /*root=*/false});
  }
  std::vector<std::string> root;
  for (const auto& [name, p] : module->named_parameters()) {
    if (nested_params.count(name) == 0) root.push_back(name);
  }
  if (!root.empty()) out.push_back({std::move(root), /*root=*/true});
  return out;
}

std::pair<int64_t, int64_t> FlatParamLayout::ParamRangeOnRank(size_t i, int64_t rank) const {
  const int64_t begin = std::max(offsets[i], rank * shard_numel);
  const int64_t end = std::min(offsets[i] + numels[i], (rank + 1) * shard_numel);
  if (end <= begin) return {0, 0};
  return {begin - offsets[i], end - offsets[i]};
}

FlatParamLayout LayOutFlatParam(const ZooModel& model, const std::vector<std::string>& fqns,
                                DType compute_dtype, int64_t shard_world) {
  std::map<std::string, int64_t> numels;
  for (const reference::TensorSpec& spec : model.oracle().ParameterSpecs()) {
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    numels[spec.name] = numel;
  }
  const auto aligned = static_cast<int64_t>(16 / ElementSize(compute_dtype));
  FlatParamLayout layout;
  layout.fqns = fqns;
  int64_t total = 0;
  for (const std::string& name : fqns) {
    const int64_t pad = aligned - total % aligned;
    if (pad < aligned) total += pad;
    layout.offsets.push_back(total);
    layout.numels.push_back(numels.at(name));
    total += numels.at(name);
  }
  const int64_t pad = shard_world - total % shard_world;
  if (pad < shard_world) total += pad;
  layout.padded_numel = total;
  layout.shard_numel = total / shard_world;
  return layout;
}

}  // namespace fsdp::conformance
