// Family `parity/fsdp` (issue "FSDP engine", train parity): the fully sharded engine on `world`
// ranks against the oracle's data-parallel run, one scenario per seed family's model
// (Transformer, MLP, DoubleLinear), every rank's losses and parameter and gradient shards at
// every step (conformance/sharded_parity.h). Sharding follows the seeds' usual pattern
// (ShardChildrenThenRoot); `reshard_after_forward` and `shard_placement` (dim0, largest_dim:
// fully_shard's shard_placement_fn, conformance/fsdp_params.h) are parameters; ctest also runs
// largest_dim at worlds 2 and 4 (test_runs), a default run at world 4 with SGD.
#include <string>

#include "conformance/model_zoo.h"
#include "conformance/parity_common.h"
#include "conformance/fsdp_params.h"
#include "conformance/scenario_registry.h"
#include "conformance/sharded_parity.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kFamily = "parity/fsdp";

Scenario MakeScenario(const ZooModelKind& kind) {
  Scenario s;
  s.info.name = std::string(kFamily) + "/" + kind.name;
  s.info.description = kind.description +
                       ": fully sharded on `world` ranks vs the oracle's data-parallel run, every "
                       "rank's losses and parameter and gradient shards at every step";
  s.info.seed_test = kind.seed_test;
  s.info.params = ParityParams(
      kind, ParamSpec::SizeString("dtype", "the engine's parameter and input dtype", "float32"));
  s.info.params.push_back(ParamSpec::SizeString(
      "reshard_after_forward", "fully_shard reshard_after_forward: True, False or an int factor",
      "True"));
  s.info.params.push_back(ShardPlacementParam());
  s.info.observations = ShardedParitySchema();
  s.info.deterministic = true;
  s.info.default_world = 2;
  s.info.min_world = 1;
  s.info.max_world = 8;
  if (const int uneven = ParityUnevenWorld(kind, s.info.params, s.info.max_world, false)) {
    // Also SGD's Nesterov momentum on the sharded parameters, where a shard that steps another
    // update rule than the full parameter's shows.
    s.info.extra_default_runs = {{uneven, {}}, {uneven, {{"optim", "sgd"}, {"nesterov", "True"}}}};
  }
  // Shard(d > 0) placements (their gradients chunked along d before the reduce-scatter) in a
  // default run too, at the largest of ctest's worlds for them (where more dims divide evenly).
  s.info.extra_default_runs.push_back(
      {4, {{kShardPlacementParam, "largest_dim"}, {"optim", "sgd"}}});
  s.excluded = NesterovNeedsSgd;
  for (int world : {2, 4}) {
    s.info.test_runs.push_back({world, {{kShardPlacementParam, "largest_dim"}}});
  }
  s.skip = SkipIntNotAFactor;
  const std::string name = kind.name;
  s.info.inputs = ZooInputsDoc(kind, "the case's dtype");
  s.inputs = ParityInputs(name);
  s.expect = [name](const CaseParams& p, int world) { return ExpectShardedParity(name, p, world); };
  s.run_rank = [name](RankEnv& env) {
    return RunShardedParityRank(name, ShardChildrenThenRoot, env);
  };
  s.judge = [name](const CaseParams& p, int world, const std::vector<nlohmann::json>& per_rank,
                   CheckList& checks) { JudgeShardedParity(name, p, world, per_rank, checks); };
  return s;
}

}  // namespace

void RegisterParityFsdpScenarios(ScenarioRegistry& registry) {
  // One model per seed family, as the issue asks: Transformer, MLP, DoubleLinear.
  for (const char* kind : {"transformer", "mlp", "double_linear"}) {
    registry.Add(MakeScenario(ZooModel::Kind(kind)));
  }
}

}  // namespace fsdp::conformance
