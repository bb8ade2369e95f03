// The one place that knows every scenario family. A family file (e.g.
// conformance/fully_shard_comm_scenarios.cc) defines `void Register<Family>Scenarios(
// ScenarioRegistry&)`; declare it here and call it from RegisterAllScenarios, one line per
// family. Explicit calls, not static initialisers, because the scenarios live in a static
// library whose unreferenced objects the linker drops.
#include "conformance/scenario_registry.h"

namespace fsdp::conformance {

void RegisterModelsScenarios(ScenarioRegistry& registry);
void RegisterParitySingleScenarios(ScenarioRegistry& registry);
void RegisterFullyShardCommScenarios(ScenarioRegistry& registry);
void RegisterFullyShardCollectiveOpsScenarios(ScenarioRegistry& registry);
void RegisterParityFsdpScenarios(ScenarioRegistry& registry);
void RegisterParityTpScenarios(ScenarioRegistry& registry);
void RegisterFullyShardAutogradScenarios(ScenarioRegistry& registry);
void RegisterCollectivesScenarios(ScenarioRegistry& registry);
void RegisterFaultsScenarios(ScenarioRegistry& registry);
void RegisterFsdpGradAccScenarios(ScenarioRegistry& registry);
void RegisterParityFsdp1Scenarios(ScenarioRegistry& registry);
void RegisterFullyShardStateDictScenarios(ScenarioRegistry& registry);
void RegisterCheckpointScenarios(ScenarioRegistry& registry);
void RegisterFsdpStateDictScenarios(ScenarioRegistry& registry);
void RegisterFsdpUnshardParamsScenarios(ScenarioRegistry& registry);
void RegisterFsdpTpIntegrationScenarios(ScenarioRegistry& registry);
void RegisterFullyShardTrainingScenarios(ScenarioRegistry& registry);
void RegisterFullyShardFrozenScenarios(ScenarioRegistry& registry);
void RegisterFullyShardMixedPrecisionScenarios(ScenarioRegistry& registry);
void RegisterFullyShardMixedPrecisionCastScenarios(ScenarioRegistry& registry);
void RegisterFullyShardMixedPrecisionFrozenScenarios(ScenarioRegistry& registry);
void RegisterFullyShardInitScenarios(ScenarioRegistry& registry);
void RegisterFullyShardPrefetchScenarios(ScenarioRegistry& registry);
void RegisterFullyShardOverlapScenarios(ScenarioRegistry& registry);
void RegisterFullyShardRegisteredParamsScenarios(ScenarioRegistry& registry);
void RegisterFsdpPrefetchScenarios(ScenarioRegistry& registry);
void RegisterFsdpWrapScenarios(ScenarioRegistry& registry);
void RegisterFsdpMixedPrecisionScenarios(ScenarioRegistry& registry);
void RegisterDtensorScenarios(ScenarioRegistry& registry);

void RegisterAllScenarios(ScenarioRegistry& registry) {
  RegisterModelsScenarios(registry);
  RegisterParitySingleScenarios(registry);
  RegisterFullyShardCommScenarios(registry);
  RegisterFullyShardCollectiveOpsScenarios(registry);
  RegisterParityFsdpScenarios(registry);
  RegisterParityTpScenarios(registry);
  RegisterFullyShardAutogradScenarios(registry);
  RegisterCollectivesScenarios(registry);
  RegisterFaultsScenarios(registry);
  RegisterFsdpGradAccScenarios(registry);
  RegisterParityFsdp1Scenarios(registry);
  RegisterFullyShardStateDictScenarios(registry);
  RegisterCheckpointScenarios(registry);
  RegisterFsdpStateDictScenarios(registry);
  RegisterFsdpUnshardParamsScenarios(registry);
  RegisterFsdpTpIntegrationScenarios(registry);
  RegisterFullyShardTrainingScenarios(registry);
  RegisterFullyShardFrozenScenarios(registry);
  RegisterFullyShardMixedPrecisionScenarios(registry);
  RegisterFullyShardMixedPrecisionCastScenarios(registry);
  RegisterFullyShardMixedPrecisionFrozenScenarios(registry);
  RegisterFullyShardInitScenarios(registry);
  RegisterFullyShardPrefetchScenarios(registry);
  RegisterFullyShardOverlapScenarios(registry);
  RegisterFullyShardRegisteredParamsScenarios(registry);
  RegisterFsdpPrefetchScenarios(registry);
  RegisterFsdpWrapScenarios(registry);
  RegisterFsdpMixedPrecisionScenarios(registry);
  RegisterDtensorScenarios(registry);
}

}  // namespace fsdp::conformance
