#include "engine/fsdp/state_dict.h"

#include <set>

#include "engine/core/error.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/nn/module.h"

namespace fsdp::fsdp2 {

namespace {

// The placement of `param` on this rank (Shard(dim), or the 2-D FSDP × TP one) as a state-dict
// sharding: the full tensor's shape and this rank's offsets in it.
nn::ShardedEntry ShardingOf(const FsdpParam& param) {
  return nn::ShardedEntry{param.tensor_shape(), param.tensor_offsets()};
}

// The FSDP parameters registered on `module`, by attribute name.
std::vector<std::pair<std::string, FsdpParam*>> FsdpParamsOn(nn::Module& module) {
  std::vector<std::pair<std::string, FsdpParam*>> out;
  for (const auto& [name, tensor] : module.parameter_slots()) {
    if (!tensor.defined()) continue;
    if (FsdpParam* p = LookupFsdpParam(tensor)) out.emplace_back(name, p);
  }
  return out;
}

// Checks the incoming value of FSDP parameter `key` before load_state_dict copies it.
void CheckLoadedValue(const nn::StateDict& state_dict, const std::string& key,
                      const FsdpParam& param) {
  const Tensor* value = state_dict.find(key);
  if (value == nullptr) return;  // reported as a missing key by the normal load
  const nn::ShardedEntry* sharding = state_dict.sharding(key);
  const nn::ShardedEntry want = ShardingOf(param);
  FSDP_CHECK(sharding != nullptr, "FSDP parameter ", key,
             " is a DTensor (", param.is_dtensor() ? param.tp_sharding()->placements_str()
                                                   : param.fsdp_placement().str(),
             " of global shape ", ShapeStr(want.global_shape),
             ") but load_state_dict got a plain tensor of shape ", ShapeStr(value->sizes()),
             ": load a sharded state dict, or full tensors with set_model_state_dict");
  FSDP_CHECK(sharding->global_shape == want.global_shape && sharding->offsets == want.offsets,
             "FSDP parameter ", key, ": the state dict's shard of global shape ",
             ShapeStr(sharding->global_shape), " at offsets ", ShapeStr(sharding->offsets),
             " is not this rank's shard (global shape ", ShapeStr(want.global_shape),
             ", offsets ", ShapeStr(want.offsets),
             "); reshard it first (set_model_state_dict, or a checkpoint)");
}

}  // namespace

void RegisterStateDictHooks(const std::shared_ptr<FsdpParamGroup>& group) {
  std::set<nn::Module*> modules;
  for (const auto& p : group->fsdp_params()) {
    modules.insert(p->module_info().module);
    for (nn::Module* m : p->module_info().shared_modules) modules.insert(m);
  }
  const std::weak_ptr<FsdpParamGroup> weak = group;
  for (nn::Module* module : modules) {
    module->register_state_dict_pre_hook([weak](nn::Module&, const std::string&, bool) {
      if (auto g = weak.lock()) g->to_sharded();
    });
    module->register_state_dict_post_hook(
        [](nn::Module& m, nn::StateDict& state_dict, const std::string& prefix) {
          for (const auto& [name, param] : FsdpParamsOn(m)) {
            if (state_dict.find(prefix + name) != nullptr) {
              state_dict.sharded.insert(prefix + name, ShardingOf(*param));
            }
          }
        });
    module->register_load_state_dict_pre_hook(
        [weak](nn::Module& m, nn::StateDict& state_dict, const std::string& prefix,
               nn::LoadStateDictState&) {
          if (auto g = weak.lock()) g->to_sharded();
          for (const auto& [name, param] : FsdpParamsOn(m)) {
            CheckLoadedValue(state_dict, prefix + name, *param);
          }
        });
    module->register_load_state_dict_post_hook([weak](nn::Module&, nn::IncompatibleKeys&) {
      // assign=True installed new tensors: adopt and re-pad them.
      if (auto g = weak.lock()) {
        for (const auto& p : g->fsdp_params()) p->reset_sharded_param();
      }
    });
  }
}

}  // namespace fsdp::fsdp2
