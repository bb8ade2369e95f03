// Runner: the one generic executor of scenarios. It resolves what to run (patterns, backend,
// world, --param values, subject) against a Catalog, plans the cases (the cartesian product of
// unfixed axes, minus excluded combinations, with skips decided up front), launches each case
// on the backend's launcher (or the external driver), validates the observations and calls the
// scenario's judge.
//
// Every name error (pattern matching nothing, unknown backend, subject or parameter, invalid
// value) is raised by Plan() before anything runs, with the valid choices listed.
//
// Ownership: borrows the catalog (must outlive the runner). Thread-safety: one thread, except
// RunCase (see cases_may_run_concurrently).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "conformance/catalog.h"
#include "conformance/checks.h"
#include "conformance/launcher.h"

namespace fsdp::conformance {

// Which cases of a ScenarioInfo::deterministic scenario the runner runs a second time,
// requiring bit-identical observations (--determinism).
enum class DeterminismCheck {
  kNone,       // "none": no case
  kFirstCase,  // "first": the first runnable case of each scenario at each world
  kEveryCase,  // "all": every case (doubles the run time of those scenarios)
};
// "none", "first", "all"; ParseDeterminismCheck throws InvalidArgument listing them.
const char* DeterminismCheckName(DeterminismCheck check);
DeterminismCheck ParseDeterminismCheck(const std::string& name);

struct RunOptions {
  std::vector<std::string> patterns;  // globs over scenario names; at least one
  // Default: "threaded" for in-process subjects, "gloo" for the external subject.
  std::optional<std::string> backend;
  std::optional<int> world;                       // Default: each scenario's default world
  std::map<std::string, std::string> params;      // --param KEY=VALUE; Default: none
  // --semantics: the FSDP semantics profile of the run ("torch-2.4", "torch-2.8";
  // docs/scenarios.md, "Semantics profiles"). It fixes the `semantics` parameter of every
  // matched scenario that declares one (a --param semantics= must agree with it). Default:
  // unset (--param semantics= if given, else each scenario's default, torch-2.4).
  std::optional<std::string> semantics;
  std::chrono::milliseconds timeout{300000};      // Default: 300 s per case
  std::chrono::milliseconds failure_grace{5000};  // Default: 5 s (see LaunchRequest)
  // Process ranks cross-check every collective (see LaunchRequest). Default:
  // true.
  bool check_collectives = true;
  // Default: the first runnable case of each deterministic scenario at each world.
  DeterminismCheck determinism = DeterminismCheck::kFirstCase;
  std::string subject = kEngineSubject;           // Default: "engine"; or "external"
  std::string driver;                             // the driver program for "external"
  // --driver-sessions auto: the driver is probed (session_launcher.h) and, when it declares
  // sessions, its ranks serve many cases each (driver_session.h); off: one process per rank
  // per case. Default: true (auto).
  bool driver_sessions = true;
  // --max-driver-ranks N: cases whose world would start more than N driver processes at once
  // are skipped, saying so. Default: 0 (no limit).
  int max_driver_ranks = 0;
  // The program and arguments that run a rank in process backends. Default (empty): this
  // executable followed by "__worker".
  std::vector<std::string> worker_command;
};

enum class CaseStatus { kPassed, kFailed, kSkipped };
const char* CaseStatusName(CaseStatus status);  // "passed", "failed", "skipped"

// One unit of work: a scenario at one combination of parameters.
struct PlannedCase {
  const Scenario* scenario = nullptr;
  CaseParams params;  // all parameters; for a whole-scenario skip only the --param ones
  int world = 1;
  std::optional<std::string> skip_reason;  // set: reported skipped without running
  // Run a second time; the judged run's observations must equal the second run's bit for bit
  // (RunOptions::determinism).
  bool check_determinism = false;
};

struct CaseResult {
  std::string scenario;
  std::string subject;
  std::string backend;
  int world = 1;
  CaseParams params;
  CaseStatus status = CaseStatus::kFailed;
  std::string skip_reason;          // kSkipped
  std::vector<std::string> errors;  // rank errors, judge errors ("rank 1: Internal: ...")
  CheckList checks;
  std::vector<nlohmann::json> observations;  // per rank; null for ranks that did not report
  double seconds = 0;

  // {name, subject, backend, world, params, status, seconds, checks, figures, errors,
  //  [skip_reason], [observations]} (docs/cli.md, "JSON output").
  nlohmann::json ToJson() const;
};

// The runner's verdict on a case's rank outcomes (however they were obtained: launched now, or
// read from a driver's files by `fsdp-conform check`): rank errors and skips, observations
// validated by the conventions and strictly by the scenario's schema, then the judge. Fills
// result.observations (moved out of `outcomes`), errors, checks, skip_reason and status (never
// throws).
void JudgeOutcomes(const Scenario& scenario, const CaseParams& params, int world,
                   std::vector<RankOutcome> outcomes, CaseResult& result);

class Runner {
 public:
  Runner(const Catalog& catalog, RunOptions options);
  ~Runner();  // EndSessions()

  // Validates the options and returns the cases in run order (scenario name, then the axes'
  // product order). Throws InvalidArgument / NotFound with the valid choices listed.
  std::vector<PlannedCase> Plan();
  // Runs one planned case (Plan() must have succeeded). Never throws for subject failures.
  // Callable from several threads at once when cases_may_run_concurrently().
  CaseResult RunCase(const PlannedCase& planned) const;
  // Whether RunCase may run on several threads at once: an in-process subject that supports
  // concurrent cases, on a backend whose ranks are threads (each case launches its own ranks
  // and process group). The external driver's launcher and process ranks take one case at a
  // time. Valid after Plan().
  bool cases_may_run_concurrently() const;
  // Plan() then RunCase() for each; `on_result` sees each result as it completes.
  std::vector<CaseResult> RunAll(const std::function<void(const CaseResult&)>& on_result = {});

  const std::string& backend() const { return backend_; }
  // The run's semantics profile, recorded in the report: --semantics, else --param semantics=,
  // else the default profile. Valid after Plan().
  const std::string& semantics() const { return semantics_; }
  // The other profiles some planned cases are judged by (the extra default runs of the
  // profile-dependent scenarios when the run leaves the profile open). Valid after Plan().
  const std::set<std::string>& other_semantics() const { return other_semantics_; }
  const RunOptions& options() const { return options_; }
  // Ends the external driver's session, if one runs (its ranks exit). RunAll() does it at its
  // end; a caller of RunCase() does it before anything it installed for the run goes away
  // (signal handlers: the session's launcher forwards signals while it runs).
  void EndSessions();
  // Whether the external driver's cases ran in sessions (known after its first case).
  bool driver_sessions_used() const { return driver_sessions_used_; }

 private:
  // Appends the cases of scenario `s` (`cases`, expanded from the run's --param values) at
  // `world` to `plan`: skipped as a whole when the scenario, the backend or the world rule it
  // out, else one PlannedCase per case not excluded (skip rules applied).
  void PlanWorld(const Scenario* s, const std::vector<CaseParams>& cases,
                 const std::map<std::string, std::string>& canonical_fixed, int world,
                 std::vector<PlannedCase>& plan) const;
  std::unique_ptr<RankLauncher> MakeLauncher() const;
  // Launches a case: on the external driver's launcher (kept across cases: a session serves
  // many), else on a fresh MakeLauncher().
  std::vector<RankOutcome> Launch(const LaunchRequest& request) const;
  // Launches `request` again and records the determinism check of `result` (a passed case):
  // every rank's observations equal the judged run's, else the first difference is named.
  void CheckDeterminism(const LaunchRequest& request, CaseResult& result) const;

  const Catalog& catalog_;
  RunOptions options_;
  std::string backend_;
  std::string semantics_;
  std::set<std::string> other_semantics_;
  std::shared_ptr<Subject> subject_;  // null for the external subject
  bool planned_ = false;
  // The external driver's launcher: a SessionLauncher when the driver serves sessions, else
  // a ProcessLauncher; made at the first case.
  mutable std::unique_ptr<RankLauncher> driver_launcher_;
  mutable bool driver_sessions_used_ = false;
  int max_planned_world_ = 1;  // the largest world of a planned case that runs (Plan())
};

}  // namespace fsdp::conformance
