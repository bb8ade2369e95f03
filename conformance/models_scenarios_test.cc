// The `models` and `parity/single` families run end to end through the runner on the threaded
// backend (world 1), each case with its default parameters, so that ctest exercises them even
// while the default catalog's threaded backend has no group factory installed.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "conformance/catalog.h"
#include "conformance/runner.h"
#include "conformance/suite.h"
#include "fakes/threaded_process_group.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;

const Catalog& ZooCatalog() {
  static const Catalog* catalog = [] {
    auto* c = new Catalog();  // never destroyed: detached rank threads may still use it
    RegisterDefaults(*c);
    c->backends.SetThreadedWorld(kBackendThreaded, [](int world, std::chrono::milliseconds) {
      auto threads = fakes::ThreadedWorld::Create(world, std::chrono::seconds(60));
      std::vector<std::shared_ptr<distributed::ProcessGroup>> groups;
      for (int r = 0; r < world; ++r) groups.push_back(threads->CreateWorldGroup(r));
      return groups;
    });
    return c;
  }();
  return *catalog;
}

std::vector<std::string> ZooScenarios() {
  std::vector<std::string> names;
  for (const std::string& name : ZooCatalog().scenarios.Names()) {
    if (name.rfind("models/", 0) == 0 || name.rfind("parity/single/", 0) == 0) {
      names.push_back(name);
    }
  }
  return names;
}

class ZooScenarioTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooScenarioTest, DefaultCasesPass) {
  const SuiteOutcome outcome = RunScenarioDefaults(ZooCatalog(), kEngineSubject, GetParam());
  EXPECT_EQ(outcome.failed, 0) << outcome.failure_report;
  EXPECT_GT(outcome.passed, 0) << outcome.skip_reason;
  EXPECT_EQ(outcome.skipped, 0) << outcome.skip_reason;
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooScenarioTest, ::testing::ValuesIn(ZooScenarios()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return GTestName(info.param);
                         });

TEST(ZooScenarios, OneOfEachPerZooModel) {
  const std::vector<std::string> names = ZooScenarios();
  for (const char* model :
       {"transformer", "mlp", "mlp_stack", "mlp_stack_seq_parallel", "double_linear", "mlp_module",
        "mlp_rms_norm", "tp_simple_model", "state_dict_model"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), std::string("models/") + model), names.end())
        << model;
    EXPECT_NE(std::find(names.begin(), names.end(), std::string("parity/single/") + model),
              names.end())
        << model;
  }
}

// A perturbed tolerance must fail: the parity judge really compares parameters and losses.
TEST(ZooScenarios, TightToleranceFailsWithTheWorstFqnNamed) {
  RunOptions options;
  options.patterns = {"parity/single/mlp_module"};
  options.params = {{"optim", "adam"}, {"amsgrad", "False"}, {"dtype", "float32"},
                    {"atol", "0"},     {"rtol", "0"},        {"steps", "2"}};
  Runner runner(ZooCatalog(), options);
  const std::vector<CaseResult> results = runner.RunAll();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, CaseStatus::kFailed);
  EXPECT_THAT(results[0].checks.Table(), HasSubstr("parameters net"));
  EXPECT_TRUE(results[0].checks.figures().count("param_max_abs_err"));
}

}  // namespace
}  // namespace fsdp::conformance
