// The conformance suite under ctest: every registered scenario, on our engine, on the threaded
// backend, at its default world with its default parameters (all axis values).
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "conformance/catalog.h"
#include "conformance/gtest_suite.h"
#include "conformance/report.h"
#include "conformance/runner.h"

FSDP_CONFORMANCE_TEST_SUITE(EngineConformance, ::fsdp::conformance::DefaultCatalog(),
                            ::fsdp::conformance::kEngineSubject);

// The extra configurations of ScenarioInfo::test_runs (other worlds, fixed axes): one test per
// scenario that has any, running them all, named "<scenario>__worlds_<N>_<M>..." (one process
// per scenario keeps ctest's per-test start-up cost low).
namespace fsdp::conformance {
namespace {

struct ExtraRuns {
  std::string scenario;
  std::vector<TestRun> runs;
  std::string name;  // the GoogleTest parameter name
};

// GoogleTest prints parameters in test listings and failures.
void PrintTo(const ExtraRuns& extra, std::ostream* os) { *os << extra.name; }

std::vector<ExtraRuns> AllExtraRuns() {
  std::vector<ExtraRuns> out;
  const Catalog& catalog = DefaultCatalog();
  for (const std::string& name : catalog.scenarios.Names()) {
    const auto& runs = catalog.scenarios.Get(name).info.test_runs;
    if (runs.empty()) continue;
    std::string test = GTestName(name) + "__worlds";
    for (const TestRun& run : runs) test += "_" + std::to_string(run.world);
    out.push_back({name, runs, test});
  }
  return out;
}

class EngineConformanceRuns : public ::testing::TestWithParam<ExtraRuns> {};

TEST_P(EngineConformanceRuns, Conforms) {
  const ExtraRuns& extra = GetParam();
  int passed = 0;
  std::string skip_reason;
  for (const TestRun& run : extra.runs) {
    RunOptions options;
    options.patterns = {extra.scenario};
    options.backend = kBackendThreaded;
    options.world = run.world;
    options.params = run.params;
    Runner runner(DefaultCatalog(), options);
    const std::vector<PlannedCase> plan = runner.Plan();
    std::vector<CaseResult> results;
    std::ostringstream failures;
    for (const PlannedCase& pc : plan) {
      results.push_back(runner.RunCase(pc));
      if (results.back().status == CaseStatus::kFailed) {
        TableWriter(failures, plan, runner.backend()).Row(results.back());
      } else if (results.back().status == CaseStatus::kSkipped && skip_reason.empty()) {
        skip_reason = "world " + std::to_string(run.world) + ": " + results.back().skip_reason;
      }
    }
    const Tally tally = CountResults(results);
    passed += tally.passed;
    EXPECT_EQ(tally.failed, 0) << "world " << run.world << ": " << SummaryLine(tally) << "\n"
                               << failures.str();
  }
  if (passed == 0 && !HasFailure()) GTEST_SKIP() << skip_reason;
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EngineConformanceRuns);
INSTANTIATE_TEST_SUITE_P(Scenarios, EngineConformanceRuns, ::testing::ValuesIn(AllExtraRuns()),
                         [](const ::testing::TestParamInfo<ExtraRuns>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace fsdp::conformance
