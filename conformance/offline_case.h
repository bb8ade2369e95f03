// Offline case tools for third parties, behind `fsdp-conform expect` and `fsdp-conform check`:
// debugging a driver without the runner starting ranks.
//
//   PrepareCase   writes one case into a directory laid out exactly like the runner's run
//                 directory: store/, the input files, rankR.request.json per rank (its "args"
//                 are the driver's flags), and, when the scenario can say what a conforming
//                 subject reports (Scenario::expect), expected/rankR.json and
//                 expected/rankR.tensors.safetensors in the result format.
//   CheckCase     judges a directory after the driver ran its ranks there: reads every rank's
//                 rankR.result.json and rankR.tensors.safetensors, validates them by the
//                 conventions and the scenario's schema and runs the judge, as `run` would.
//
// Ownership: borrows the catalog. Thread-safety: one thread.
#pragma once

#include <map>
#include <string>

#include "conformance/catalog.h"
#include "conformance/runner.h"

namespace fsdp::conformance {

// One case, resolved: the scenario, its parameters (every axis fixed) and the world size.
struct ResolvedCase {
  const Scenario* scenario = nullptr;
  CaseParams params;
  int world = 1;
};

// Resolves `scenario_name` at `world` (0: the scenario's default) with `params` fixed.
// InvalidArgument when an axis is left unfixed (naming it and its values), when the world is
// out of the scenario's range, or when the case is excluded or skipped here (with the reason);
// NotFound for an unknown scenario.
ResolvedCase ResolveCase(const Catalog& catalog, const std::string& scenario_name, int world,
                         const std::map<std::string, std::string>& params);

// What PrepareCase wrote.
struct PreparedCase {
  std::vector<std::string> request_files;  // per rank
  bool has_expected = false;               // expected/ was written
};

// Writes the case into `dir` (created; it must not exist or be empty). `backend` is the one
// the requests name (drivers usually ignore all but gloo). Unavailable naming the path when a
// file cannot be written.
PreparedCase PrepareCase(const ResolvedCase& c, const std::string& backend, const std::string& dir);

// The verdict on `dir` (a directory PrepareCase or the runner wrote, after a driver ran there):
// the case is read back from rank0.request.json.
CaseResult CheckCase(const Catalog& catalog, const std::string& dir);

}  // namespace fsdp::conformance
