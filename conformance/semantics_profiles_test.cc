// The semantics profiles tell implementations apart: the engine's observations under one
// profile pass the judge of every profile with the same rules for the scenario and fail the
// others', for the count and event scenarios whose expectations depend on the root's
// reshard-after-forward rule or on the end-of-backward sweep (an explicit
// reshard_after_forward=True is where the profiles differ there), and for a mixed-precision
// plan whose expectations depend on the reduce dtype of a policy without reduce_dtype, and for
// a group with a frozen parameter of another dtype (docs/scenarios.md, "Semantics profiles").
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "conformance/catalog.h"
#include "conformance/fsdp_params.h"
#include "conformance/runner.h"

namespace fsdp::conformance {
namespace {

struct ProfileRun {
  CaseResult result;
  const Scenario* scenario;
};

ProfileRun RunUnder(const std::string& scenario, const std::map<std::string, std::string>& params,
                    const std::string& semantics) {
  RunOptions options;
  options.patterns = {scenario};
  options.backend = kBackendThreaded;
  // The scenario's default world only (its extra default runs would add cases, or repeat this
  // one when `params` fixes the axes they set).
  options.world = DefaultCatalog().scenarios.Get(scenario).info.default_world;
  options.semantics = semantics;
  options.params = params;
  Runner runner(DefaultCatalog(), options);
  const std::vector<PlannedCase> plan = runner.Plan();
  EXPECT_EQ(plan.size(), 1u) << scenario;
  return {runner.RunCase(plan.front()), plan.front().scenario};
}

// Judges `run`'s observations as if the case had been run under `semantics`.
bool PassesJudgeOf(const ProfileRun& run, const std::string& semantics) {
  CaseParams params = run.result.params;
  params.set(kSemanticsParam, semantics);
  CheckList checks;
  run.scenario->judge(params, run.result.world, run.result.observations, checks);
  return !checks.empty() && checks.all_passed();
}

// A scenario, the parameters that make it one case, and which of the profile's rules its
// expectations depend on (profiles with equal keys are judged alike).
struct ProfileCase {
  std::string scenario;
  std::map<std::string, std::string> params;
  std::function<std::vector<bool>(fsdp2::Semantics)> rules;
};

std::vector<bool> RootAndSweepRules(fsdp2::Semantics s) {
  return {fsdp2::LazyInitKeepsRootUnsharded(s, /*auto_reshard_after_forward=*/false),
          ProfileSweepsEveryGroupAtEndOfBackward(s)};
}

TEST(SemanticsProfiles, ObservationsPassOnlyTheJudgesOfProfilesWithTheirRules) {
  const std::vector<std::string> profiles = fsdp2::SemanticsNames();
  const std::map<std::string, std::string> raf_true = {{"reshard_after_forward", "True"}};
  std::map<std::string, std::string> no_checkpoint = raf_true;
  no_checkpoint["checkpoint_impl"] = "none";
  const std::vector<ProfileCase> cases = {
      {"fully_shard_comm/communication_count", raf_true, RootAndSweepRules},
      {"fully_shard_comm/backward_prefetch_forward_backward", no_checkpoint, RootAndSweepRules},
      {"fully_shard_comm/backward_prefetch_multi_forward", no_checkpoint, RootAndSweepRules},
      // the end-of-backward sweep (unused and prefetch-only groups swept under torch-2.8)
      {"fully_shard_comm/backward_prefetch_unused_in_backward", raf_true, RootAndSweepRules},
      // param_dtype without reduce_dtype: the reduce-scatter's bytes
      {"fully_shard_mixed_precision/compute_dtype",
       {{"param_dtype", "bfloat16"}},
       [](fsdp2::Semantics s) {
         return std::vector<bool>{ProfileReducesInParamDtypeWhenReduceDtypeUnset(s)};
       }},
      // a gradient accumulated without sync: in the reduce dtype in .grad, or moved out of it
      {"fully_shard_mixed_precision/grad_acc_with_reduce_dtype",
       {{"reshard_after_forward", "False"}},
       [](fsdp2::Semantics s) {
         return std::vector<bool>{ProfileKeepsUnshardedGradInReduceDtype(s)};
       }},
      // a frozen parameter of another dtype: lazy init's error, else the reduce-scatter's bytes
      {"fully_shard_mixed_precision/reduce_dtype_after_frozen_first_forward",
       {{"frozen_dtype", "float64"}, {"frozen_first_forward", "False"}, {"reduce_dtype", "None"}},
       [](fsdp2::Semantics s) {
         return std::vector<bool>{ProfileChecksFrozenParamDtypes(s),
                                  ProfileReducesInParamDtypeWhenReduceDtypeUnset(s)};
       }},
  };
  for (const ProfileCase& c : cases) {
    for (const std::string& ran : profiles) {
      const ProfileRun run = RunUnder(c.scenario, c.params, ran);
      ASSERT_EQ(run.result.status, CaseStatus::kPassed) << c.scenario << " " << ran << "\n"
                                                        << run.result.ToJson().dump(2);
      for (const std::string& judged : profiles) {
        const bool same_rules =
            c.rules(fsdp2::ParseSemantics(ran)) == c.rules(fsdp2::ParseSemantics(judged));
        EXPECT_EQ(PassesJudgeOf(run, judged), same_rules)
            << c.scenario << ": ran under " << ran << ", judged under " << judged;
      }
    }
  }
}

}  // namespace
}  // namespace fsdp::conformance
