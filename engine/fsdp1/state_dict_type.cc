#include "engine/fsdp1/state_dict_type.h"

#include "engine/core/error.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/runtime_utils.h"

namespace fsdp::fsdp1 {

const char* StateDictTypeName(StateDictType type) {
  switch (type) {
    case StateDictType::kFullStateDict: return "FULL_STATE_DICT";
    case StateDictType::kLocalStateDict: return "LOCAL_STATE_DICT";
    case StateDictType::kShardedStateDict: return "SHARDED_STATE_DICT";
  }
  return "?";
}

const char* StateDictConfigName(const StateDictConfig& config) {
  static constexpr const char* kNames[] = {"FullStateDictConfig", "LocalStateDictConfig",
                                           "ShardedStateDictConfig"};
  return kNames[config.index()];
}

StateDictConfig DefaultStateDictConfig(StateDictType type) {
  switch (type) {
    case StateDictType::kFullStateDict: return FullStateDictConfig{};
    case StateDictType::kLocalStateDict: return LocalStateDictConfig{};
    case StateDictType::kShardedStateDict: return ShardedStateDictConfig{};
  }
  return FullStateDictConfig{};
}

StateDictSettings SetStateDictType(const nn::Module& module, StateDictType type,
                                   std::optional<StateDictConfig> config) {
  const StateDictConfig expected = DefaultStateDictConfig(type);
  if (!config) config = expected;
  FSDP_CHECK(config->index() == expected.index(), "Expected state_dict_config of type ",
             StateDictConfigName(expected), " but got ", StateDictConfigName(*config));
  std::optional<StateDictSettings> previous;
  for (FullyShardedDataParallel* state : GetFsdpStates(module)) {
    if (!previous) {
      previous = StateDictSettings{state->state_dict_type, state->state_dict_config};
    } else {
      FSDP_CHECK(previous->state_dict_type == state->state_dict_type,
                 "All FSDP modules should have the same state_dict_type. (",
                 DescribeInstance(*state), " has ", StateDictTypeName(state->state_dict_type),
                 ", the first instance ", StateDictTypeName(previous->state_dict_type), ")");
    }
    state->state_dict_type = type;
    state->state_dict_config = *config;
  }
  return previous.value_or(StateDictSettings{});
}

StateDictSettings GetStateDictType(const nn::Module& module) {
  std::optional<StateDictSettings> settings;
  for (FullyShardedDataParallel* state : GetFsdpStates(module)) {
    if (!settings) {
      settings = StateDictSettings{state->state_dict_type, state->state_dict_config};
      continue;
    }
    FSDP_CHECK(settings->state_dict_type == state->state_dict_type &&
                   settings->state_dict_config.index() == state->state_dict_config.index(),
               "All FSDP modules must have the same state dict settings. Got ",
               StateDictTypeName(settings->state_dict_type), " and ",
               StateDictTypeName(state->state_dict_type), " (", DescribeInstance(*state), ")");
  }
  FSDP_CHECK(settings.has_value(), "No FSDP modules in ", module.type_name());
  return *settings;
}

StateDictTypeScope::StateDictTypeScope(nn::ModulePtr module, StateDictType type,
                                       std::optional<StateDictConfig> config)
    : module_(std::move(module)) {
  FSDP_CHECK(module_ != nullptr, "state_dict_type: null module");
  previous_ = SetStateDictType(*module_, type, std::move(config));
}

StateDictTypeScope::~StateDictTypeScope() {
  SetStateDictType(*module_, previous_.state_dict_type, previous_.state_dict_config);
}

}  // namespace fsdp::fsdp1
