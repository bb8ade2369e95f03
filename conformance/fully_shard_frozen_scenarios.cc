// Family `fully_shard_frozen` (test_fully_shard_frozen.py): training with parameters whose
// requires_grad is False, each a training plan (conformance/fully_shard_plan.h) on the zoo's
// MLPStack (fully_shard on blocks 0 and 1, then the root, which manages block 2), judged against
// the oracle and against collective counts and payload bytes derived from which parameters
// train:
//   train_mixed_requires_grad_per_group     TestFullyShardFrozen
//       .test_train_mixed_requires_grad_per_group: only the biases train (BitFit), so every
//       group mixes frozen and trainable parameters; frozen before fully_shard or after it
//       (on the sharded parameters)
//   train_mixed_requires_grad_across_groups TestFullyShardFrozen
//       .test_train_mixed_requires_grad_across_groups: blocks 0 and 2 (the first and the root's
//       group) frozen, block 1 trains; optionally every parameter trains again from the last
//       step on
// A frozen parameter gets no gradient (.grad None), is not reduce-scattered (a group's
// reduce-scatter holds its trainable parameters' padded shards only, and a group without any
// issues none) and keeps its value. Block 0, frozen and fed an input that requires no gradient,
// runs no pre-backward of its own, but block 1's implicit backward prefetch all-gathers it.
// Both scenarios also run at world 3 by default (uneven shards).
#include <string>
#include <vector>

#include "conformance/fully_shard_plan.h"
#include "conformance/model_zoo.h"
#include "conformance/scenario_registry.h"

namespace fsdp::conformance {

namespace {

constexpr const char* kKind = "mlp_stack";
constexpr const char* kFrozen = "test_fully_shard_frozen.py::TestFullyShardFrozen::";

FullyShardPlan FrozenBase(const CaseParams& p) {
  FullyShardPlan plan = DecodePlanBase(kKind, p);
  plan.reshard_after_forward = p.GetBool("reshard_after_forward");
  return plan;
}

ParamSpec ReshardAfterForward() {
  return ParamSpec::Axis("reshard_after_forward", "every fully_shard call's reshard_after_forward",
                         {"True", "False"});
}

Scenario TrainMixedRequiresGradPerGroup() {
  Scenario s = MakePlanScenario(
      "fully_shard_frozen/train_mixed_requires_grad_per_group",
      "MLPStack training its biases only (every weight frozen, before or after fully_shard): "
      "each group reduce-scatters its biases' padded shards only; gradient and parameter shards "
      "vs the oracle, frozen weights unchanged and without gradients",
      std::string(kFrozen) + "test_train_mixed_requires_grad_per_group", kKind, "float64",
      {ReshardAfterForward(),
       ParamSpec::Axis("freeze_after_init",
                       "True: requires_grad_(False) on the sharded parameters after fully_shard; "
                       "False: on the module's parameters before it",
                       {"False", "True"})},
      [](const CaseParams& p, int) {
        FullyShardPlan plan = FrozenBase(p);
        plan.freeze_after_init = p.GetBool("freeze_after_init");
        for (const std::string& name : ZooModel::Make(kKind, p).ParameterNames()) {
          if (name.find("bias") == std::string::npos) plan.frozen_params.push_back(name);
        }
        return plan;
      });
  s.info.extra_default_runs = {{3, {}}};
  return s;
}

Scenario TrainMixedRequiresGradAcrossGroups() {
  Scenario s = MakePlanScenario(
      "fully_shard_frozen/train_mixed_requires_grad_across_groups",
      "MLPStack with blocks 0 and 2 frozen (the first group and the root's) and block 1 "
      "training, optionally all unfrozen from the last step on: no reduce-scatter for a group "
      "without trainable parameters, no backward all-gather for one whose outputs require no "
      "gradient; gradient and parameter shards vs the oracle",
      std::string(kFrozen) + "test_train_mixed_requires_grad_across_groups", kKind, "float64",
      {ReshardAfterForward(),
       ParamSpec::Axis("unfreeze_params",
                       "True: requires_grad_(True) on the frozen parameters before the last step",
                       {"False", "True"})},
      [](const CaseParams& p, int) {
        FullyShardPlan plan = FrozenBase(p);
        for (const std::string& name : ZooModel::Make(kKind, p).ParameterNames()) {
          if (name.rfind("0.", 0) == 0 || name.rfind("2.", 0) == 0) {
            plan.frozen_params.push_back(name);
          }
        }
        if (p.GetBool("unfreeze_params")) plan.unfreeze_at_step = plan.steps - 1;
        return plan;
      });
  s.info.extra_default_runs = {{3, {}}};
  return s;
}

}  // namespace

void RegisterFullyShardFrozenScenarios(ScenarioRegistry& registry) {
  registry.Add(TrainMixedRequiresGradPerGroup());
  registry.Add(TrainMixedRequiresGradAcrossGroups());
}

}  // namespace fsdp::conformance
