// Every scenario that states its expected observations (Scenario::expect) is consistent with
// itself: at its default world and each case of its default parameters, the expectations
// follow the scenario's schema strictly and pass its judge. So `fsdp-conform expect` hands a
// third party observations the suite accepts, and a judge cannot silently demand more. And
// its judge reads the tensors: one changed value fails the case.
#include <gtest/gtest.h>

#include "conformance/catalog.h"
#include "conformance/observations.h"
#include "conformance/runner.h"

namespace fsdp::conformance {
namespace {

TEST(ScenarioExpectations, FollowTheSchemaAndPassTheJudge) {
  const Catalog& catalog = DefaultCatalog();
  int judged = 0;
  for (const Scenario* s : catalog.scenarios.All()) {
    if (!s->expect) continue;
    SCOPED_TRACE(s->info.name);
    EXPECT_FALSE(s->info.observations.empty()) << "expectations without a schema";
    for (const CaseParams& params : ExpandCases(s->info.name, s->info.params, {})) {
      const int world = s->info.default_world;
      if ((s->excluded && s->excluded(params, world)) || (s->skip && s->skip(params, world))) {
        continue;
      }
      std::vector<RankOutcome> outcomes;
      for (nlohmann::json& obs : s->expect(params, world)) {
        outcomes.push_back(RankOutcome::Ok(std::move(obs), 0));
      }
      ASSERT_EQ(static_cast<int>(outcomes.size()), world);
      CaseResult result;
      JudgeOutcomes(*s, params, world, outcomes, result);
      EXPECT_EQ(result.status, CaseStatus::kPassed)
          << params.Label() << ": " << result.ToJson().dump().substr(0, 2000);
      ++judged;
    }
  }
  EXPECT_GT(judged, 0);
}

// The first value of the first non-empty tensor of the last rank, plus one; false when no rank
// reports a value.
bool ChangeOneTensorValue(std::vector<nlohmann::json>& per_rank) {
  nlohmann::json& obs = per_rank.back();
  if (!obs.contains(kTensors)) return false;
  for (auto it = obs[kTensors].begin(); it != obs[kTensors].end(); ++it) {
    nlohmann::json& data = (*it)["data"];
    if (data.empty()) continue;
    data[0] = data[0].get<double>() + 1;
    return true;
  }
  return false;
}

TEST(ScenarioExpectations, AChangedTensorValueFailsTheJudge) {
  const Catalog& catalog = DefaultCatalog();
  int judged = 0;
  for (const Scenario* s : catalog.scenarios.All()) {
    if (!s->expect) continue;
    SCOPED_TRACE(s->info.name);
    const int world = s->info.default_world;
    for (const CaseParams& params : ExpandCases(s->info.name, s->info.params, {})) {
      if ((s->excluded && s->excluded(params, world)) || (s->skip && s->skip(params, world))) {
        continue;
      }
      std::vector<nlohmann::json> expected = s->expect(params, world);
      if (!ChangeOneTensorValue(expected)) continue;
      std::vector<RankOutcome> outcomes;
      for (nlohmann::json& obs : expected) outcomes.push_back(RankOutcome::Ok(std::move(obs), 0));
      CaseResult result;
      JudgeOutcomes(*s, params, world, outcomes, result);
      EXPECT_EQ(result.status, CaseStatus::kFailed) << params.Label();
      ++judged;
      break;  // the scenario's first case that reports tensors
    }
  }
  EXPECT_GT(judged, 0);
}

// Every scenario of the suite declares what its ranks report, so every observation of every
// subject is validated strictly; and a scenario that runs a model declares its inputs.
TEST(ScenarioSchemas, EveryScenarioDeclaresItsObservations) {
  for (const Scenario* s : DefaultCatalog().scenarios.All()) {
    EXPECT_FALSE(s->info.observations.empty()) << s->info.name << " declares no observation schema";
  }
}

}  // namespace
}  // namespace fsdp::conformance
