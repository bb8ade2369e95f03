// GoogleTest glue: one line instantiates the whole conformance suite for a subject.
//
//   FSDP_CONFORMANCE_TEST_SUITE(EngineConformance, fsdp::conformance::DefaultCatalog(), "engine");
//
// defines the parameterized test `EngineConformance.Conforms` with one instance per
// registered scenario (named like "fully_shard_comm__all_gather_fp32"), each running every
// default case on the threaded backend at the scenario's default world. A failing case fails
// the test with the case table (errors and failed checks); a scenario whose cases were all
// skipped is GTEST_SKIP'ped with the reason. `catalog_expr` is evaluated when the tests are
// registered (at InitGoogleTest), not during static initialisation.
//
// Include this header only from test files (it includes gtest); the library itself does not
// depend on GoogleTest.
#pragma once

#include <gtest/gtest.h>

#include "conformance/catalog.h"
#include "conformance/suite.h"

#define FSDP_CONFORMANCE_TEST_SUITE(SuiteName, catalog_expr, subject_name)                    \
  class SuiteName : public ::testing::TestWithParam<std::string> {};                          \
  TEST_P(SuiteName, Conforms) {                                                               \
    const ::fsdp::conformance::SuiteOutcome outcome =                                         \
        ::fsdp::conformance::RunScenarioDefaults((catalog_expr), (subject_name), GetParam()); \
    if (outcome.failed > 0) {                                                                 \
      FAIL() << outcome.failure_report;                                                       \
    }                                                                                         \
    if (outcome.passed == 0) {                                                                \
      GTEST_SKIP() << outcome.skip_reason;                                                    \
    }                                                                                         \
  }                                                                                           \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SuiteName);                                   \
  INSTANTIATE_TEST_SUITE_P(Scenarios, SuiteName,                                              \
                           ::testing::ValuesIn((catalog_expr).scenarios.Names()),             \
                           [](const ::testing::TestParamInfo<std::string>& info) {            \
                             return ::fsdp::conformance::GTestName(info.param);               \
                           })
