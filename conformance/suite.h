// Suite: runs one scenario the way the GoogleTest suite does (every default case, at the
// scenario's default world, on one backend) and condenses the result for a test assertion.
// The GoogleTest glue itself is the macro in gtest_suite.h; this part needs no GoogleTest.
//
// Thread-safety: stateless functions.
#pragma once

#include <string>

#include "conformance/catalog.h"
#include "conformance/scenario.h"

namespace fsdp::conformance {

struct SuiteOutcome {
  int passed = 0;
  int failed = 0;
  int skipped = 0;
  std::string failure_report;  // the failed cases with their errors and check tables
  std::string skip_reason;     // the first skip reason (all that matters when nothing ran)
  std::string summary;         // "N passed, N failed, N skipped"
};

// Runs `scenario` (a name) on `subject` and `backend` at its default world and default
// parameters (every value of every axis). Never throws for failures of the subject; throws
// only for unknown names.
SuiteOutcome RunScenarioDefaults(const Catalog& catalog, const std::string& subject,
                                 const std::string& scenario,
                                 const std::string& backend = kBackendThreaded);

// A scenario name as a GoogleTest parameter name: "fully_shard_comm/all_gather_fp32" becomes
// "fully_shard_comm__all_gather_fp32" (only letters, digits and '_').
std::string GTestName(const std::string& scenario);

}  // namespace fsdp::conformance
