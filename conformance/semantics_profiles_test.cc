// The semantics profiles tell implementations apart: the engine's observations under one
// profile pass that profile's judge and fail the other's, for the count and event scenarios
// whose expectations depend on the root's reshard-after-forward rule or on the end-of-backward
// sweep (docs/scenarios.md, "Semantics profiles"). An explicit reshard_after_forward=True is
// where the profiles differ.
#include <gtest/gtest.h>

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

ProfileRun RunUnder(const std::string& scenario, const std::string& semantics) {
  RunOptions options;
  options.patterns = {scenario};
  options.backend = kBackendThreaded;
  options.semantics = semantics;
  options.params = {{"reshard_after_forward", "True"}};
  if (scenario == "fully_shard_comm/backward_prefetch_forward_backward" ||
      scenario == "fully_shard_comm/backward_prefetch_multi_forward") {
    options.params["checkpoint_impl"] = "none";
  }
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

TEST(SemanticsProfiles, ObservationsPassOnlyTheirOwnProfilesJudge) {
  const std::vector<std::string> profiles = fsdp2::SemanticsNames();
  for (const char* scenario :
       {"fully_shard_comm/communication_count",
        "fully_shard_comm/backward_prefetch_forward_backward",
        "fully_shard_comm/backward_prefetch_multi_forward",
        // the end-of-backward sweep (unused and prefetch-only groups swept under torch-2.8)
        "fully_shard_comm/backward_prefetch_unused_in_backward"}) {
    for (const std::string& ran : profiles) {
      const ProfileRun run = RunUnder(scenario, ran);
      ASSERT_EQ(run.result.status, CaseStatus::kPassed) << scenario << " " << ran << "\n"
                                                        << run.result.ToJson().dump(2);
      for (const std::string& judged : profiles) {
        EXPECT_EQ(PassesJudgeOf(run, judged), judged == ran)
            << scenario << ": ran under " << ran << ", judged under " << judged;
      }
    }
  }
}

}  // namespace
}  // namespace fsdp::conformance
