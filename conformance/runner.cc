#include "conformance/runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "conformance/driver_protocol.h"
#include "conformance/session_launcher.h"
#include "conformance/fsdp_params.h"
#include "conformance/observations.h"
#include "conformance/process_launcher.h"
#include "conformance/threaded_launcher.h"
#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

std::string Join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : sep) + i;
  return out;
}

// "a/b: x, y; c/d: (none)" over the matched scenarios, for unknown --param keys.
std::string ParamsOfScenarios(const std::vector<const Scenario*>& scenarios) {
  std::vector<std::string> parts;
  for (const Scenario* s : scenarios) {
    std::vector<std::string> names;
    for (const auto& p : s->info.params) names.push_back(p.name);
    parts.push_back(s->info.name + ": " + (names.empty() ? "(none)" : Join(names)));
  }
  return Join(parts, "; ");
}

}  // namespace

const char* CaseStatusName(CaseStatus status) {
  switch (status) {
    case CaseStatus::kPassed:
      return "passed";
    case CaseStatus::kFailed:
      return "failed";
    case CaseStatus::kSkipped:
      return "skipped";
  }
  return "?";
}

nlohmann::json CaseResult::ToJson() const {
  nlohmann::json j;
  j["name"] = scenario;
  j["subject"] = subject;
  j["backend"] = backend;
  j["world"] = world;
  j["params"] = params.values();
  j["status"] = CaseStatusName(status);
  j["seconds"] = seconds;
  j["checks"] = nlohmann::json::array();
  for (const auto& c : checks.checks()) j["checks"].push_back(c.ToJson());
  j["figures"] = checks.figures();
  j["errors"] = errors;
  if (status == CaseStatus::kSkipped) j["skip_reason"] = skip_reason;
  bool any = false;
  nlohmann::json per_rank = nlohmann::json::array();
  for (const auto& o : observations) {
    nlohmann::json reported = ReportedObservations(o);
    any = any || !reported.is_null();
    per_rank.push_back(std::move(reported));
  }
  if (any) j["observations"] = std::move(per_rank);
  return j;
}

const char* DeterminismCheckName(DeterminismCheck check) {
  switch (check) {
    case DeterminismCheck::kNone:
      return "none";
    case DeterminismCheck::kFirstCase:
      return "first";
    case DeterminismCheck::kEveryCase:
      return "all";
  }
  return "?";
}

DeterminismCheck ParseDeterminismCheck(const std::string& name) {
  for (DeterminismCheck c :
       {DeterminismCheck::kNone, DeterminismCheck::kFirstCase, DeterminismCheck::kEveryCase}) {
    if (name == DeterminismCheckName(c)) return c;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown --determinism '", name,
             "'; choose none, first or all");
}

Runner::Runner(const Catalog& catalog, RunOptions options)
    : catalog_(catalog), options_(std::move(options)) {}

Runner::~Runner() { EndSessions(); }

void Runner::EndSessions() { driver_launcher_.reset(); }

std::vector<PlannedCase> Runner::Plan() {
  const bool external = options_.subject == kExternalSubject;
  backend_ = options_.backend.value_or(external ? kBackendGloo : kBackendThreaded);

  // Names first: scenarios, backend, subject, then parameters.
  std::vector<const Scenario*> scenarios = catalog_.scenarios.Match(options_.patterns);
  catalog_.backends.Get(backend_);  // an unknown backend fails here, listing the known ones
  if (external) {
    FSDP_CHECK(!options_.driver.empty(),
               "--subject external needs --driver PATH (the program run once per rank)");
    std::error_code ec;
    FSDP_CHECK(std::filesystem::is_regular_file(options_.driver, ec) &&
                   ::access(options_.driver.c_str(), X_OK) == 0,
               "--driver ", options_.driver, " is not an executable file");
    subject_.reset();
  } else {
    FSDP_CHECK(options_.driver.empty(),
               "--driver is only used with --subject external (the "
               "subject is '",
               options_.subject, "')");
    subject_ = catalog_.subjects.Create(options_.subject);
  }
  if (options_.world) {
    FSDP_CHECK(*options_.world >= 1, "--world must be at least 1, got ", *options_.world);
  }
  FSDP_CHECK(options_.timeout.count() > 0, "--timeout must be positive");
  FSDP_CHECK(options_.max_driver_ranks >= 0, "--max-driver-ranks must be >= 0, got ",
             options_.max_driver_ranks);
  for (const auto& [key, value] : options_.params) {
    bool any = false;
    for (const Scenario* s : scenarios) {
      for (const auto& p : s->info.params) any = any || p.name == key;
    }
    FSDP_CHECK(any, "no matched scenario has parameter '", key,
               "'; parameters: ", ParamsOfScenarios(scenarios));
  }
  // The run's semantics profile: a known name, one value for the whole run.
  semantics_ = fsdp2::SemanticsName(fsdp2::kDefaultSemantics);
  const auto param_semantics = options_.params.find(kSemanticsParam);
  if (options_.semantics) {
    semantics_ = fsdp2::SemanticsName(fsdp2::ParseSemantics(*options_.semantics));
    FSDP_CHECK(param_semantics == options_.params.end() || param_semantics->second == semantics_,
               "--semantics ", semantics_, " and --param semantics=", param_semantics->second,
               " disagree; give one of them");
  } else if (param_semantics != options_.params.end()) {
    semantics_ = fsdp2::SemanticsName(fsdp2::ParseSemantics(param_semantics->second));
  }
  const bool semantics_fixed = options_.semantics || param_semantics != options_.params.end();

  std::vector<PlannedCase> plan;
  for (const Scenario* s : scenarios) {
    const ScenarioInfo& info = s->info;
    std::map<std::string, std::string> fixed;
    for (const auto& p : info.params) {
      if (auto it = options_.params.find(p.name); it != options_.params.end()) {
        fixed[p.name] = it->second;
      } else if (p.name == kSemanticsParam && options_.semantics) {
        fixed[p.name] = semantics_;
      }
    }
    // Without --world: the default world, then the scenario's extra default runs, each with
    // the axes it fixes (the user's --param values win).
    // A run that fixes the profile judges everything under it: the extra runs that exist to
    // cover another profile are left out.
    std::vector<TestRun> runs = {TestRun{options_.world.value_or(info.default_world), {}}};
    if (!options_.world) {
      for (const TestRun& run : info.extra_default_runs) {
        if (semantics_fixed && run.params.count(kSemanticsParam)) continue;
        runs.push_back(run);
      }
    }
    for (const TestRun& run : runs) {
      std::map<std::string, std::string> run_fixed = run.params;
      for (const auto& [k, v] : fixed) run_fixed[k] = v;
      // Validates and canonicalises the values even when the scenario is then skipped.
      std::vector<CaseParams> cases = ExpandCases(info.name, info.params, run_fixed);
      std::map<std::string, std::string> canonical_fixed;
      for (const auto& [k, v] : run_fixed) canonical_fixed[k] = cases.front().GetString(k);
      PlanWorld(s, cases, canonical_fixed, run.world, plan);
    }
  }
  max_planned_world_ = 1;
  other_semantics_.clear();
  for (const PlannedCase& pc : plan) {
    if (!pc.skip_reason) max_planned_world_ = std::max(max_planned_world_, pc.world);
    if (pc.params.has(kSemanticsParam) && pc.params.GetString(kSemanticsParam) != semantics_) {
      other_semantics_.insert(pc.params.GetString(kSemanticsParam));
    }
  }
  planned_ = true;
  return plan;
}

void Runner::PlanWorld(const Scenario* s, const std::vector<CaseParams>& cases,
                       const std::map<std::string, std::string>& canonical_fixed, int world,
                       std::vector<PlannedCase>& plan) const {
  const ScenarioInfo& info = s->info;
  const bool external = options_.subject == kExternalSubject;
  std::optional<std::string> whole = info.requirements.UnmetBy(catalog_.backends.Get(backend_));
  if (!whole && (world < info.min_world || world > info.max_world)) {
    whole = "world " + std::to_string(world) + " is outside the scenario's range [" +
            std::to_string(info.min_world) + ", " + std::to_string(info.max_world) + "]";
  }
  // The backend's own reason ("backend nccl: no CUDA device visible") is the most specific.
  if (!whole && !external) whole = catalog_.backends.Unavailable(backend_, world);
  if (!whole && external && options_.max_driver_ranks > 0 && world > options_.max_driver_ranks) {
    whole = "world " + std::to_string(world) + " would start " + std::to_string(world) +
            " driver processes at once; --max-driver-ranks allows " +
            std::to_string(options_.max_driver_ranks);
  }
  if (whole) {
    plan.push_back(PlannedCase{s, CaseParams(canonical_fixed), world, whole});
    return;
  }

  std::vector<PlannedCase> kept;
  std::string excluded_reason;
  for (auto& c : cases) {
    if (s->excluded) {
      if (auto why = s->excluded(c, world)) {
        if (excluded_reason.empty()) excluded_reason = c.Label() + ": " + *why;
        continue;
      }
    }
    PlannedCase pc{s, c, world, std::nullopt};
    if (s->skip) {
      // A skip rule may also reject a value that is invalid in combination (e.g.
      // reshard_after_forward=None under torch-2.4): the plan fails, naming the case.
      try {
        pc.skip_reason = s->skip(c, world);
      } catch (const Error& e) {
        FSDP_THROW(e.code(), "scenario ", info.name, " (", c.Label(), "): ", e.message());
      }
    }
    if (!pc.skip_reason && subject_) pc.skip_reason = subject_->Unsupported(*s, c, backend_);
    kept.push_back(std::move(pc));
  }
  if (kept.empty()) {
    plan.push_back(
        PlannedCase{s, CaseParams(canonical_fixed), world,
                    "the seed runs none of the selected cases (" + excluded_reason + ")"});
    return;
  }
  if (info.deterministic && options_.determinism != DeterminismCheck::kNone) {
    for (auto& pc : kept) {
      if (pc.skip_reason) continue;
      pc.check_determinism = true;
      if (options_.determinism == DeterminismCheck::kFirstCase) break;
    }
  }
  for (auto& pc : kept) plan.push_back(std::move(pc));
}

std::vector<RankOutcome> Runner::Launch(const LaunchRequest& request) const {
  if (subject_) return MakeLauncher()->Launch(request);
  if (!driver_launcher_) {
    driver_sessions_used_ = options_.driver_sessions && DriverServesSessions({options_.driver});
    if (driver_sessions_used_) {
      driver_launcher_ = std::make_unique<SessionLauncher>(
          std::vector<std::string>{options_.driver}, max_planned_world_);
    } else {
      driver_launcher_ = MakeLauncher();
    }
  }
  return driver_launcher_->Launch(request);
}

bool Runner::cases_may_run_concurrently() const {
  return subject_ != nullptr && subject_->supports_concurrent_cases() &&
         catalog_.backends.Get(backend_).capabilities.ranks == distributed::RankPlacement::kThreads;
}

std::unique_ptr<RankLauncher> Runner::MakeLauncher() const {
  if (!subject_)
    return std::make_unique<ProcessLauncher>(std::vector<std::string>{options_.driver});
  const distributed::BackendSpec& backend = catalog_.backends.Get(backend_);
  if (backend.capabilities.ranks == distributed::RankPlacement::kThreads) {
    return std::make_unique<ThreadedLauncher>(backend, subject_);
  }
  std::vector<std::string> command = options_.worker_command;
  if (command.empty()) command = {SelfExecutable(), kWorkerCommand};
  return std::make_unique<ProcessLauncher>(command, subject_->name());
}

CaseResult Runner::RunCase(const PlannedCase& planned) const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, planned_ && planned.scenario != nullptr,
                  "Runner::RunCase needs a case from Plan()");
  const Scenario& scenario = *planned.scenario;
  CaseResult result;
  result.scenario = scenario.info.name;
  result.subject = options_.subject;
  result.backend = backend_;
  result.world = planned.world;
  result.params = planned.params;
  if (planned.skip_reason) {
    result.status = CaseStatus::kSkipped;
    result.skip_reason = *planned.skip_reason;
    return result;
  }

  const auto start = std::chrono::steady_clock::now();
  auto finish = [&](CaseStatus status) {
    result.status = status;
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  };

  LaunchRequest request;
  request.scenario = &scenario;
  request.params = planned.params;
  request.world = planned.world;
  request.backend = backend_;
  request.timeout = options_.timeout;
  request.failure_grace = options_.failure_grace;
  request.check_collectives = options_.check_collectives;
  std::vector<RankOutcome> outcomes;
  if (scenario.inputs) {
    try {
      auto inputs = std::make_shared<CaseInputs>(scenario.inputs(planned.params, planned.world));
      inputs->Validate(scenario.info.name, planned.world);
      request.inputs = std::move(inputs);
    } catch (const Error& e) {
      result.errors.push_back(std::string("inputs: ") + ErrorCodeName(e.code()) + ": " +
                              e.message());
      return finish(CaseStatus::kFailed);
    }
  }
  try {
    outcomes = Launch(request);
  } catch (const Error& e) {
    result.errors.push_back(std::string("launcher: ") + ErrorCodeName(e.code()) + ": " +
                            e.message());
    return finish(CaseStatus::kFailed);
  }

  JudgeOutcomes(scenario, planned.params, planned.world, std::move(outcomes), result);
  if (planned.check_determinism && result.status == CaseStatus::kPassed) {
    CheckDeterminism(request, result);
  }
  return finish(result.status);
}

void Runner::CheckDeterminism(const LaunchRequest& request, CaseResult& result) const {
  const std::string name = "determinism: a second run's observations equal the first's bit for bit";
  std::vector<RankOutcome> again;
  try {
    again = Launch(request);
  } catch (const Error& e) {
    result.checks.Fail(name, std::string("the second run failed to launch: ") + e.what());
    result.status = CaseStatus::kFailed;
    return;
  }
  std::string difference;
  for (size_t r = 0; r < again.size() && difference.empty(); ++r) {
    const std::string rank = "rank " + std::to_string(r);
    if (again[r].status != RankOutcome::Status::kOk) {
      difference = again[r].Describe(static_cast<int>(r));
    } else if (again[r].observations != result.observations[r]) {
      difference = rank + ": " + FirstDifference(result.observations[r], again[r].observations);
    }
  }
  result.checks.CheckTrue(name, difference.empty(), difference);
  result.status = result.checks.all_passed() ? CaseStatus::kPassed : CaseStatus::kFailed;
}

void JudgeOutcomes(const Scenario& scenario, const CaseParams& params, int world,
                   std::vector<RankOutcome> outcomes, CaseResult& result) {
  result.observations.assign(outcomes.size(), nullptr);
  std::string skipped;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    RankOutcome& o = outcomes[r];
    if (o.status == RankOutcome::Status::kError) {
      result.errors.push_back(o.Describe(static_cast<int>(r)));
    } else if (o.status == RankOutcome::Status::kSkipped) {
      if (skipped.empty()) skipped = "rank " + std::to_string(r) + ": " + o.message;
    } else {
      result.observations[r] = std::move(o.observations);
      try {
        ValidateObservations(result.observations[r], "rank " + std::to_string(r));
        if (!scenario.info.observations.empty()) {
          scenario.info.observations.Validate(result.observations[r], "rank " + std::to_string(r));
        }
      } catch (const Error& e) {
        result.errors.push_back(std::string(ErrorCodeName(e.code())) + ": " + e.message());
      }
    }
  }
  if (!result.errors.empty()) {
    result.status = CaseStatus::kFailed;
    return;
  }
  if (!skipped.empty()) {
    result.skip_reason = skipped;
    result.status = CaseStatus::kSkipped;
    return;
  }

  try {
    scenario.judge(params, world, result.observations, result.checks);
  } catch (const CaseSkipped& e) {
    result.skip_reason = "judge: " + e.reason();
    result.status = CaseStatus::kSkipped;
    return;
  } catch (const Error& e) {
    result.errors.push_back(std::string("judge: ") + ErrorCodeName(e.code()) + ": " + e.message());
  } catch (const std::exception& e) {
    result.errors.push_back(std::string("judge: uncaught exception: ") + e.what());
  }
  if (result.errors.empty() && result.checks.empty()) {
    result.errors.push_back("judge: recorded no checks");
  }
  const bool passed = result.errors.empty() && result.checks.all_passed();
  result.status = passed ? CaseStatus::kPassed : CaseStatus::kFailed;
}

std::vector<CaseResult> Runner::RunAll(const std::function<void(const CaseResult&)>& on_result) {
  std::vector<CaseResult> results;
  for (const PlannedCase& pc : Plan()) {
    results.push_back(RunCase(pc));
    if (on_result) on_result(results.back());
  }
  EndSessions();
  return results;
}

}  // namespace fsdp::conformance
