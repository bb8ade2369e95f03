// Report: the human table that `fsdp-conform run` prints while cases finish, the semantics and
// summary lines, and the --json document.
//
// Ownership: a TableWriter borrows its stream. Thread-safety: one thread.
#pragma once

#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "conformance/runner.h"

namespace fsdp::conformance {

struct Tally {
  int passed = 0;
  int failed = 0;
  int skipped = 0;
};
Tally CountResults(const std::vector<CaseResult>& results);
// Exactly "N passed, N failed, N skipped".
std::string SummaryLine(const Tally& tally);
// "semantics: NAME": the run's FSDP semantics profile, printed before the summary; when some
// cases are judged by other profiles (`others`: the extra default runs of the profile-dependent
// scenarios), " (extra default runs of the profile-dependent scenarios: NAME ...)" follows.
std::string SemanticsLine(const std::string& semantics, const std::set<std::string>& others = {});

// Prints one row per case, with column widths fixed from the plan so that rows can stream:
//   SCENARIO  CASE  BACKEND  WORLD  STATUS  FIGURES  TIME
// CASE shows the axes and the sizes that differ from their defaults; FIGURES the judge's
// figures and check count (cut at 80 characters), the error count, or the skip reason.
// A failed case is followed by its errors and failed checks, indented. The scenarios of the
// plan must outlive the writer.
class TableWriter {
 public:
  TableWriter(std::ostream& out, const std::vector<PlannedCase>& plan, const std::string& backend);
  void Header();
  void Row(const CaseResult& result);

 private:
  std::ostream& out_;
  size_t scenario_width_ = 8;
  size_t case_width_ = 4;
  size_t backend_width_ = 7;
  std::map<std::string, const ScenarioInfo*> infos_;
};

// The --json document:
//   {"version": 1, "semantics": "torch-2.4",
//    "summary": {"passed": N, "failed": N, "skipped": N},
//    "cases": [CaseResult::ToJson(), ...]}
// `semantics` is the run's profile (Runner::semantics()).
nlohmann::json ResultsJson(const std::vector<CaseResult>& results, const std::string& semantics);

}  // namespace fsdp::conformance
