// Every scenario that states its expected observations (Scenario::expect) is consistent with
// itself: at its default world and each case of its default parameters, the expectations
// follow the scenario's schema strictly and pass its judge. So `fsdp-conform expect` hands a
// third party observations the suite accepts, and a judge cannot silently demand more.
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

}  // namespace
}  // namespace fsdp::conformance
