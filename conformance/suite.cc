#include "conformance/suite.h"

#include <cctype>
#include <sstream>

#include "conformance/report.h"
#include "conformance/runner.h"

namespace fsdp::conformance {

SuiteOutcome RunScenarioDefaults(const Catalog& catalog, const std::string& subject,
                                 const std::string& scenario, const std::string& backend) {
  RunOptions options;
  options.patterns = {scenario};
  options.backend = backend;
  options.subject = subject;
  Runner runner(catalog, options);
  std::vector<PlannedCase> plan = runner.Plan();
  std::vector<CaseResult> results;
  SuiteOutcome outcome;
  for (const PlannedCase& pc : plan) {
    results.push_back(runner.RunCase(pc));
    const CaseResult& r = results.back();
    if (r.status == CaseStatus::kFailed) {
      std::ostringstream one;
      TableWriter failed(one, plan, runner.backend());
      failed.Row(r);
      outcome.failure_report += one.str();
    } else if (r.status == CaseStatus::kSkipped && outcome.skip_reason.empty()) {
      outcome.skip_reason = r.skip_reason;
    }
  }
  const Tally t = CountResults(results);
  outcome.passed = t.passed;
  outcome.failed = t.failed;
  outcome.skipped = t.skipped;
  outcome.summary = SummaryLine(t);
  if (!outcome.failure_report.empty()) {
    outcome.failure_report = scenario + " on " + subject + "/" + backend + ": " + outcome.summary +
                             "\n" + outcome.failure_report;
  }
  return outcome;
}

std::string GTestName(const std::string& scenario) {
  std::string out;
  for (char c : scenario) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
      out += c;
    } else if (c == '/') {
      out += "__";
    } else {
      out += '_';
    }
  }
  return out.empty() ? "_" : out;
}

}  // namespace fsdp::conformance
