#include "conformance/runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "conformance/catalog.h"
#include "conformance/testing/toy_catalog.h"
#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;
using testing::ToyCatalog;

std::vector<CaseResult> RunToy(RunOptions options) {
  Runner runner(ToyCatalog(), std::move(options));
  return runner.RunAll();
}

RunOptions Options(std::vector<std::string> patterns) {
  RunOptions o;
  o.patterns = std::move(patterns);
  o.timeout = std::chrono::milliseconds(20000);
  o.failure_grace = std::chrono::milliseconds(200);
  return o;
}

std::string PlanError(RunOptions options) {
  try {
    Runner runner(ToyCatalog(), std::move(options));
    runner.Plan();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string Dump(const CaseResult& r) { return r.ToJson().dump(2); }

TEST(Runner, ToySumPassesOnOneAndFourThreadedRanks) {
  for (int world : {1, 4}) {
    RunOptions o = Options({"toy/sum"});
    o.world = world;
    const auto results = RunToy(o);
    ASSERT_EQ(results.size(), 2u);  // mode: plain, doubled
    for (const auto& r : results) {
      EXPECT_EQ(r.status, CaseStatus::kPassed) << Dump(r);
      EXPECT_EQ(r.world, world);
      EXPECT_EQ(r.backend, "threaded");
      EXPECT_EQ(r.observations.size(), static_cast<size_t>(world));
      EXPECT_EQ(r.checks.checks().size(), 4u * world);
    }
  }
}

TEST(Runner, AxesRunInTheSeedsOrder) {
  const auto results = RunToy(Options({"toy/sum"}));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].params.GetString("mode"), "plain");
  EXPECT_EQ(results[1].params.GetString("mode"), "doubled");
  EXPECT_EQ(results[0].world, 4);  // the scenario's default world
}

TEST(Runner, WrongAnswerFailsWithTheCheckNamed) {
  RunOptions o = Options({"toy/sum"});
  o.params = {{"bias", "1"}, {"mode", "plain"}};
  o.world = 2;
  const auto results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  const CaseResult& r = results[0];
  EXPECT_EQ(r.status, CaseStatus::kFailed);
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.checks.failed_count(), 2);  // both ranks' totals
  EXPECT_THAT(r.checks.Table(), HasSubstr("rank 0 total"));
  EXPECT_THAT(r.checks.Table(), HasSubstr("first mismatch at [0]: expected 10, got 9"));
}

TEST(Runner, ExcludedCasesAreDroppedAndSkipsReported) {
  RunOptions o = Options({"toy/matrix"});
  o.world = 3;
  const auto results = RunToy(o);
  ASSERT_EQ(results.size(), 5u);  // 2 x 3 minus (y, 3)
  int skipped = 0;
  for (const auto& r : results) {
    if (r.params.GetInt("b") == 2) {
      EXPECT_EQ(r.status, CaseStatus::kSkipped);
      EXPECT_EQ(r.skip_reason, "b=2 needs an even world");
      ++skipped;
    } else {
      EXPECT_EQ(r.status, CaseStatus::kPassed) << Dump(r);
    }
  }
  EXPECT_EQ(skipped, 2);
}

TEST(Runner, AllCasesExcludedReportsOneSkip) {
  RunOptions o = Options({"toy/matrix"});
  o.params = {{"a", "y"}, {"b", "3"}};
  const auto results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, CaseStatus::kSkipped);
  EXPECT_THAT(results[0].skip_reason, HasSubstr("the seed never runs y with 3"));
}

TEST(Runner, SkipReasons) {
  {  // a backend without a factory
    std::unique_ptr<Catalog> catalog = testing::MakeToyCatalog();
    catalog->backends.SetProcessGroup("gloo", distributed::ProcessGroupFactory());
    RunOptions o = Options({"toy/sum"});
    o.backend = "gloo";
    Runner runner(*catalog, o);
    const auto results = runner.RunAll();
    ASSERT_EQ(results.size(), 1u);  // skipped as a whole
    EXPECT_EQ(results[0].status, CaseStatus::kSkipped);
    EXPECT_EQ(results[0].skip_reason, "backend gloo has no process-group factory in this build");
  }
  {  // a backend whose capabilities do not meet the scenario's requirements
    RunOptions o = Options({"toy/matrix"});
    o.backend = "toyproc";
    const auto results = RunToy(o);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].skip_reason,
              "scenario needs ranks as threads of one process; backend toyproc runs them as "
              "processes");
  }
  {  // a world outside the range
    RunOptions o = Options({"toy/sum"});
    o.world = 9;
    const auto results = RunToy(o);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].skip_reason, "world 9 is outside the scenario's range [1, 8]");
  }
  {  // a scenario that needs a CUDA device, on a backend whose ranks run on the CPU
    const auto results = RunToy(Options({"toy/gpu"}));
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].status, CaseStatus::kSkipped);
    EXPECT_EQ(results[0].skip_reason,
              "scenario runs on a CUDA device; backend threaded runs on the CPU");
  }
}

TEST(Runner, BodySkipIsReported) {
  RunOptions o = Options({"toy/flaws"});
  o.params = {{"flaw", "skip"}};
  const auto results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, CaseStatus::kSkipped);
  EXPECT_EQ(results[0].skip_reason, "rank 0: toy cannot run this here");
}

TEST(Runner, RankErrorFailsAndBlockedPeersAreAborted) {
  RunOptions o = Options({"toy/flaws"});
  o.params = {{"flaw", "rank_error"}, {"bad_rank", "1"}};
  o.world = 3;
  const auto results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  const CaseResult& r = results[0];
  EXPECT_EQ(r.status, CaseStatus::kFailed);
  ASSERT_EQ(r.errors.size(), 3u) << Dump(r);
  EXPECT_EQ(r.errors[1], "rank 1: FailedPrecondition: toy failure on rank 1");
  // The fake process group aborts the peers blocked in the barrier, naming the failed rank.
  EXPECT_THAT(r.errors[0], HasSubstr("rank 0: Aborted"));
  EXPECT_THAT(r.errors[0], HasSubstr("rank 1"));
  EXPECT_THAT(r.errors[2], HasSubstr("rank 2: Aborted"));
  EXPECT_LT(r.seconds, 2.0);  // promptly, not at the deadline
}

TEST(Runner, DeadlineIsReported) {
  RunOptions o = Options({"toy/flaws"});
  o.params = {{"flaw", "sleep"}, {"sleep_ms", "1000"}};
  o.world = 2;
  o.timeout = std::chrono::milliseconds(100);
  const auto results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, CaseStatus::kFailed);
  ASSERT_EQ(results[0].errors.size(), 2u);
  EXPECT_THAT(results[0].errors[0], HasSubstr("rank 0: DeadlineExceeded"));
  EXPECT_THAT(results[0].errors[0], HasSubstr("did not finish within 0.1 s"));
}

TEST(Runner, MalformedObservationsAndJudgeProblemsFail) {
  for (const auto& [flaw, expected] : std::vector<std::pair<std::string, std::string>>{
           {"bad_obs", "DataLoss: rank 0: losses must be an array"},
           {"no_checks", "judge: recorded no checks"},
           {"judge_throws", "judge: DataLoss: rank 0 reported no 'missing_key' (keys: rank)"}}) {
    RunOptions o = Options({"toy/flaws"});
    o.params = {{"flaw", flaw}};
    o.world = 1;
    const auto results = RunToy(o);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].status, CaseStatus::kFailed) << flaw;
    ASSERT_FALSE(results[0].errors.empty()) << flaw;
    EXPECT_EQ(results[0].errors[0], expected);
  }
}

TEST(Runner, NameErrorsListTheValidChoices) {
  RunOptions unknown_backend = Options({"toy/sum"});
  unknown_backend.backend = "mpi";
  EXPECT_THAT(PlanError(unknown_backend),
              HasSubstr("unknown backend 'mpi'; backends: gloo, nccl, threaded, toyproc"));
  EXPECT_THAT(PlanError(Options({"nope/*"})), HasSubstr("toy/flaws, toy/gpu, toy/matrix, toy/sum"));
  RunOptions unknown_param = Options({"toy/sum", "toy/matrix"});
  unknown_param.params = {{"n_layers", "2"}};
  const std::string err = PlanError(unknown_param);
  EXPECT_THAT(err, HasSubstr("no matched scenario has parameter 'n_layers'"));
  EXPECT_THAT(err, HasSubstr("toy/matrix: a, b; toy/sum: mode, scale, bias"));
  RunOptions bad_value = Options({"toy/sum"});
  bad_value.params = {{"mode", "tripled"}};
  EXPECT_THAT(PlanError(bad_value), HasSubstr("valid values: plain, doubled"));
  RunOptions unknown_subject = Options({"toy/sum"});
  unknown_subject.subject = "torch";
  EXPECT_THAT(PlanError(unknown_subject),
              HasSubstr("unknown subject 'torch'; subjects: engine, external"));
  RunOptions no_driver = Options({"toy/sum"});
  no_driver.subject = "external";
  EXPECT_THAT(PlanError(no_driver), HasSubstr("needs --driver PATH"));
  RunOptions stray_driver = Options({"toy/sum"});
  stray_driver.driver = "/bin/true";
  EXPECT_THAT(PlanError(stray_driver), HasSubstr("only used with --subject external"));
}

TEST(Runner, ParamAppliesToTheScenariosThatHaveIt) {
  RunOptions o = Options({"toy/sum", "toy/matrix"});
  o.params = {{"b", "1"}};
  o.world = 2;
  const auto results = RunToy(o);
  ASSERT_EQ(results.size(), 4u);  // matrix: a in {x, y} with b=1; sum: two modes
  EXPECT_EQ(results[0].scenario, "toy/matrix");
  EXPECT_EQ(results[0].params.GetString("b"), "1");
  EXPECT_EQ(results[2].scenario, "toy/sum");
  EXPECT_FALSE(results[2].params.has("b"));
  for (const auto& r : results) EXPECT_EQ(r.status, CaseStatus::kPassed) << Dump(r);
}

// --semantics against the default catalog: planning only (nothing runs).
std::vector<PlannedCase> PlanDefault(RunOptions options, std::string* semantics = nullptr) {
  Runner runner(DefaultCatalog(), std::move(options));
  std::vector<PlannedCase> plan = runner.Plan();
  if (semantics) *semantics = runner.semantics();
  return plan;
}

std::string PlanDefaultError(RunOptions options) {
  try {
    PlanDefault(std::move(options));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Runner, SemanticsFixesTheParameterOfTheScenariosThatDeclareIt) {
  const std::string count = "fully_shard_comm/communication_count";
  const std::string parity = "parity/fsdp/mlp";  // declares no `semantics`
  std::string semantics;
  RunOptions o = Options({count, parity});
  o.semantics = "torch-2.8";
  const std::vector<PlannedCase> plan = PlanDefault(o, &semantics);
  EXPECT_EQ(semantics, "torch-2.8");
  int declaring = 0;
  for (const PlannedCase& pc : plan) {
    if (pc.scenario->info.name == count) {
      ++declaring;
      EXPECT_EQ(pc.params.GetString("semantics"), "torch-2.8");
    } else {
      EXPECT_FALSE(pc.params.has("semantics")) << pc.scenario->info.name;
    }
  }
  // reshard_after_forward True, False, 2, and the extra default run of the int 1; the extra
  // default runs under the later profile are left out, the run fixing the profile.
  EXPECT_EQ(declaring, 4);
  // Without --semantics: each scenario's default, recorded as the default profile, plus the
  // profile-dependent scenario's extra default runs under the later profile (which fix it).
  Runner open_profile(DefaultCatalog(), Options({count}));
  int later = 0;
  for (const PlannedCase& pc : open_profile.Plan()) {
    const bool extra = pc.params.GetString("semantics") == "torch-2.8";
    later += extra ? 1 : 0;
    if (!extra) EXPECT_EQ(pc.params.GetString("semantics"), "torch-2.4");
  }
  EXPECT_EQ(later, 4);  // True, False, 2 and None under torch-2.8
  EXPECT_EQ(open_profile.semantics(), "torch-2.4");
  EXPECT_EQ(open_profile.other_semantics(), std::set<std::string>{"torch-2.8"});
  // --param semantics= alone sets the run's profile too.
  RunOptions param = Options({count});
  param.params = {{"semantics", "torch-2.8"}};
  PlanDefault(param, &semantics);
  EXPECT_EQ(semantics, "torch-2.8");
}

TEST(Runner, SemanticsErrorsNameTheProblem) {
  RunOptions unknown = Options({"fully_shard_comm/communication_count"});
  unknown.semantics = "torch-2.6";
  EXPECT_THAT(PlanDefaultError(unknown),
              HasSubstr("unknown FSDP semantics 'torch-2.6'; known profiles: torch-2.4, "
                        "torch-2.8, torch-2.15"));
  RunOptions disagree = unknown;
  disagree.semantics = "torch-2.8";
  disagree.params = {{"semantics", "torch-2.4"}};
  EXPECT_THAT(PlanDefaultError(disagree),
              HasSubstr("--semantics torch-2.8 and --param semantics=torch-2.4 disagree"));
  RunOptions none = Options({"fully_shard_comm/communication_count"});
  none.params = {{"reshard_after_forward", "None"}};
  const std::string err = PlanDefaultError(none);
  EXPECT_THAT(err, HasSubstr("scenario fully_shard_comm/communication_count (n_layers=2,"));
  EXPECT_THAT(err, HasSubstr("reshard_after_forward=None is not valid under semantics torch-2.4"));
  none.semantics = "torch-2.8";
  EXPECT_EQ(PlanDefaultError(none), "");
}

TEST(Runner, TableSubjectRunsItsBodiesAndSkipsTheRest) {
  std::unique_ptr<Catalog> catalog = testing::MakeToyCatalog();
  catalog->subjects.Add("thirdparty", [] {
    auto s = std::make_shared<TableSubject>("thirdparty");
    s->Add("toy/matrix", [](RankEnv& env) {
      return nlohmann::json{{"a", env.params.GetString("a")}};
    });
    return s;
  });
  RunOptions o = Options({"toy/matrix", "toy/sum"});
  o.subject = "thirdparty";
  o.params = {{"a", "x"}, {"b", "1"}, {"mode", "plain"}};
  Runner runner(*catalog, o);
  const auto results = runner.RunAll();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].status, CaseStatus::kPassed) << Dump(results[0]);
  EXPECT_EQ(results[0].subject, "thirdparty");
  EXPECT_EQ(results[1].status, CaseStatus::kSkipped);
  EXPECT_EQ(results[1].skip_reason, "subject thirdparty does not implement toy/sum");
}

// Cases run at once only where the subject says it can and every rank is a thread: the engine
// on the threaded backend; a third party's subject when it declares so; never process ranks.
TEST(Runner, CasesRunAtOnceOnlyForSubjectsThatSupportItOnThreadedRanks) {
  std::unique_ptr<Catalog> catalog = testing::MakeToyCatalog();
  for (bool declared : {false, true}) {
    catalog->subjects.Add("thirdparty" + std::to_string(declared), [declared] {
      auto s = std::make_shared<TableSubject>("thirdparty");
      s->set_supports_concurrent_cases(declared);
      return s;
    });
  }
  auto concurrent = [&](const std::string& subject, const std::string& backend) {
    RunOptions o = Options({"toy/sum"});
    o.subject = subject;
    o.backend = backend;
    Runner runner(*catalog, o);
    runner.Plan();
    return runner.cases_may_run_concurrently();
  };
  EXPECT_TRUE(concurrent(kEngineSubject, "threaded"));
  EXPECT_FALSE(concurrent(kEngineSubject, "gloo"));
  EXPECT_FALSE(concurrent("thirdparty0", "threaded"));
  EXPECT_TRUE(concurrent("thirdparty1", "threaded"));
}

// A run without --world adds each scenario's extra default runs (an uneven world, with the axes
// they fix); --param values win over those; --world replaces them all.
TEST(Runner, ExtraDefaultRunsJoinARunWithoutWorld) {
  const Scenario& scenario = DefaultCatalog().scenarios.Get("parity/fsdp1/mlp");
  ASSERT_GE(scenario.info.extra_default_runs.size(), 1u);
  auto plan_of = [](RunOptions o) {
    Runner runner(DefaultCatalog(), std::move(o));
    return runner.Plan();
  };
  RunOptions o = Options({"parity/fsdp1/mlp"});
  std::map<int, int> cases_per_world;
  for (const PlannedCase& pc : plan_of(o)) {
    ++cases_per_world[pc.world];
    if (pc.world == scenario.info.default_world) continue;
    // A case at an extra world carries the axes one of that world's extra runs fixes.
    bool matches = false;
    for (const TestRun& extra : scenario.info.extra_default_runs) {
      bool all = extra.world == pc.world;
      for (const auto& [key, value] : extra.params) all = all && pc.params.GetString(key) == value;
      matches = matches || all;
    }
    EXPECT_TRUE(matches) << "world " << pc.world << ": " << pc.params.Label();
  }
  std::set<int> worlds = {scenario.info.default_world};
  for (const TestRun& extra : scenario.info.extra_default_runs) worlds.insert(extra.world);
  ASSERT_EQ(cases_per_world.size(), worlds.size());
  // An extra run at another world fixes axes, so it plans fewer cases than the default run
  // (one at the default world, e.g. clip_grad_norm=0.5:1, adds to the default world's count).
  for (const TestRun& extra : scenario.info.extra_default_runs) {
    if (extra.world == scenario.info.default_world) continue;
    EXPECT_GT(cases_per_world[scenario.info.default_world], cases_per_world[extra.world]);
  }

  o.params = {{"backward_prefetch", "None"}};
  for (const PlannedCase& pc : plan_of(o)) {
    EXPECT_EQ(pc.params.GetString("backward_prefetch"), "None") << "world " << pc.world;
  }
  o.world = 3;
  for (const PlannedCase& pc : plan_of(o)) EXPECT_EQ(pc.world, 3);
}

// A deterministic scenario's first case runs twice; observations that change between the runs
// fail it, naming the rank and the value. --determinism none skips the second run.
TEST(Runner, NondeterministicObservationsFailTheDeterminismCheck) {
  RunOptions o = Options({"toy/flaws"});
  o.params = {{"flaw", "nondeterministic"}};
  auto results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, CaseStatus::kFailed) << Dump(results[0]);
  EXPECT_THAT(results[0].checks.Table(), HasSubstr("determinism"));
  EXPECT_THAT(results[0].checks.Table(), HasSubstr("rank 0: run:"));

  o.params = {{"flaw", "none"}};
  results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, CaseStatus::kPassed) << Dump(results[0]);
  EXPECT_THAT(Dump(results[0]), HasSubstr("determinism"));

  o.params = {{"flaw", "nondeterministic"}};
  o.determinism = DeterminismCheck::kNone;
  results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, CaseStatus::kPassed) << Dump(results[0]);
  EXPECT_THROW(ParseDeterminismCheck("sometimes"), Error);
}

TEST(CaseResult, JsonShape) {
  RunOptions o = Options({"toy/sum"});
  o.params = {{"mode", "plain"}};
  o.world = 2;
  const auto results = RunToy(o);
  ASSERT_EQ(results.size(), 1u);
  const nlohmann::json j = results[0].ToJson();
  EXPECT_EQ(j["name"], "toy/sum");
  EXPECT_EQ(j["backend"], "threaded");
  EXPECT_EQ(j["subject"], "engine");
  EXPECT_EQ(j["world"], 2);
  EXPECT_EQ(j["params"], (nlohmann::json{{"bias", "0"}, {"mode", "plain"}, {"scale", "3"}}));
  EXPECT_EQ(j["status"], "passed");
  EXPECT_TRUE(j["seconds"].is_number());
  ASSERT_EQ(j["checks"].size(), 8u);
  for (const char* k : {"name", "expected", "actual", "passed"}) {
    EXPECT_TRUE(j["checks"][0].contains(k)) << k;
  }
  EXPECT_EQ(j["errors"], nlohmann::json::array());
  EXPECT_FALSE(j.contains("skip_reason"));
  ASSERT_EQ(j["observations"].size(), 2u);
  const nlohmann::json& rank1 = j["observations"][1];
  EXPECT_EQ(rank1["comm_counts"]["forward"]["allreduce_"], 1);
  EXPECT_EQ(rank1["events"][0], nlohmann::json::array({"unshard", "", "FORWARD"}));
  EXPECT_EQ(rank1["losses"][0], 9.0);
  EXPECT_FALSE(rank1.contains("tensors"));  // only the reported conventions
  EXPECT_FALSE(rank1.contains("value"));
  EXPECT_TRUE(j["figures"].contains("max_abs_err"));
}

}  // namespace
}  // namespace fsdp::conformance
