// FSDP1 state-dict types and their configs (PyTorch's StateDictType, FullStateDictConfig,
// LocalStateDictConfig, ShardedStateDictConfig, StateDictSettings in fsdp/api.py) and the
// settings API of FullyShardedDataParallel: `set_state_dict_type`, `get_state_dict_type` and
// the `state_dict_type(module, type, config)` scope (docs/fsdp1.md, "State dicts"):
//
//   {
//     fsdp1::StateDictTypeScope scope(fsdp_model, fsdp1::StateDictType::kShardedStateDict);
//     nn::StateDict sd = fsdp_model->state_dict();   // ShardedTensor-style entries
//   }                                                // previous type and config restored
//
// The type and config are stored on every FSDP instance of the module's tree (FsdpState::
// state_dict_type / state_dict_config); the hooks of state_dict_utils.h read them. A config of
// the wrong class for the type throws RuntimeError's text "Expected state_dict_config of type
// FullStateDictConfig but got LocalStateDictConfig" (InvalidArgument).
//
// Ownership: values; the scope holds the module (std::shared_ptr) until it restores.
// Thread-safety: a rank's module tree is used by its thread only.
#pragma once

#include <optional>
#include <string>
#include <variant>

#include "engine/nn/module.h"

namespace fsdp::fsdp1 {

// StateDictType.FULL_STATE_DICT (default), LOCAL_STATE_DICT, SHARDED_STATE_DICT.
enum class StateDictType { kFullStateDict, kLocalStateDict, kShardedStateDict };
const char* StateDictTypeName(StateDictType type);  // "FULL_STATE_DICT", ...

// FullStateDictConfig(offload_to_cpu=False, rank0_only=False): with rank0_only every rank
// still takes part (all-gathers) and only rank 0 keeps the FSDP-managed entries.
struct FullStateDictConfig {
  bool offload_to_cpu = false;  // Default: values stay on the compute device
  bool rank0_only = false;      // Default: every rank returns the full dict
};
// LocalStateDictConfig(offload_to_cpu=False).
struct LocalStateDictConfig {
  bool offload_to_cpu = false;
};
// ShardedStateDictConfig(offload_to_cpu=False, _use_dtensor=False). `use_dtensor` is set by
// FSDP itself when the instance was given a device mesh (the values are then DTensor-style
// Shard(0) pieces; the StateDict representation is the same).
struct ShardedStateDictConfig {
  bool offload_to_cpu = false;
  bool use_dtensor = false;
};
using StateDictConfig =
    std::variant<FullStateDictConfig, LocalStateDictConfig, ShardedStateDictConfig>;
// "FullStateDictConfig", "LocalStateDictConfig", "ShardedStateDictConfig".
const char* StateDictConfigName(const StateDictConfig& config);
// The config class `type` expects, default-constructed.
StateDictConfig DefaultStateDictConfig(StateDictType type);

// StateDictSettings(state_dict_type, state_dict_config).
struct StateDictSettings {
  StateDictType state_dict_type = StateDictType::kFullStateDict;
  StateDictConfig state_dict_config = FullStateDictConfig{};
};

// `FullyShardedDataParallel.set_state_dict_type`: sets the type and config (default: the type's
// default config) on every FSDP instance of `module`'s tree and returns the previous settings.
// Throws InvalidArgument for a config of another class ("Expected state_dict_config of type
// ... but got ...") and when the instances do not share one type ("All FSDP modules should
// have the same state_dict_type."). A tree without FSDP instances returns the defaults.
StateDictSettings SetStateDictType(const nn::Module& module, StateDictType type,
                                   std::optional<StateDictConfig> config = std::nullopt);
// `FullyShardedDataParallel.get_state_dict_type`: the settings shared by the tree's instances;
// throws InvalidArgument when they differ or when there is no FSDP instance.
StateDictSettings GetStateDictType(const nn::Module& module);

// `FullyShardedDataParallel.state_dict_type(module, type, config)`: set_state_dict_type on
// construction, the previous settings restored on destruction.
class StateDictTypeScope {
 public:
  StateDictTypeScope(nn::ModulePtr module, StateDictType type,
                     std::optional<StateDictConfig> config = std::nullopt);
  ~StateDictTypeScope();
  StateDictTypeScope(const StateDictTypeScope&) = delete;
  StateDictTypeScope& operator=(const StateDictTypeScope&) = delete;

 private:
  nn::ModulePtr module_;
  StateDictSettings previous_;
};

}  // namespace fsdp::fsdp1
