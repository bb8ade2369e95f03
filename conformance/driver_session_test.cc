// Driver sessions (driver_session.h, session_launcher.h) end to end with a torch-free kit
// driver (conformance/testing/toy_session_driver.py) serving toy/sum: the capability probe,
// many cases per process, a new session for a larger world, a rank that dies or hangs mid-session (the
// case fails naming it, no process outlives the run, the next case runs in a fresh session),
// --driver-sessions off and --max-driver-ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "conformance/runner.h"
#include "conformance/session_launcher.h"
#include "conformance/testing/toy_catalog.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;
using testing::ToyCatalog;

bool HavePython() { return std::system("python3 -c 'import json' >/dev/null 2>&1") == 0; }

// A temporary directory holding a wrapper script around the toy session driver (with the
// fault environment it is given) and the pids the driver's ranks record.
class SessionDriverDir {
 public:
  SessionDriverDir() {
    char templ[] = "/tmp/fsdp-session-test.XXXXXX";
    path_ = ::mkdtemp(templ);
  }
  ~SessionDriverDir() { std::filesystem::remove_all(path_); }

  // An executable wrapper: `VAR=value ... exec python3 toy_session_driver.py "$@"`.
  std::string Driver(const std::string& env = "") const {
    const std::string p = path_ + "/driver.sh";
    std::ofstream(p) << "#!/bin/sh\nTOY_DRIVER_PIDS='" << path_ << "' " << env
                     << " exec python3 '" << FSDP_SOURCE_DIR
                     << "/conformance/testing/toy_session_driver.py' \"$@\"\n";
    ::chmod(p.c_str(), 0755);
    return p;
  }
  // The pids that served rank `r`'s cases, in order.
  std::vector<int> Pids(int r) const {
    std::ifstream in(path_ + "/rank" + std::to_string(r) + ".pids");
    std::vector<int> pids;
    for (int pid; in >> pid;) pids.push_back(pid);
    return pids;
  }

 private:
  std::string path_;
};

RunOptions ToySumOptions(const std::string& driver, int world) {
  RunOptions o;
  o.patterns = {"toy/sum"};
  o.subject = kExternalSubject;
  o.driver = driver;
  o.world = world;
  o.timeout = std::chrono::milliseconds(20000);
  o.failure_grace = std::chrono::milliseconds(300);
  return o;
}

std::string Dump(const CaseResult& r) { return r.ToJson().dump(2); }

bool Alive(int pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Removes the run and session directories that failed cases keep.
void RemoveKeptFiles(const std::vector<CaseResult>& results) {
  for (const auto& r : results) {
    for (const auto& e : r.errors) {
      for (const std::string marker : {"(files kept in ", "; the session's logs in "}) {
        const size_t at = e.find(marker);
        if (at == std::string::npos) continue;
        const std::string rest = e.substr(at + marker.size());
        const std::string dir = rest.substr(0, rest.find_first_of(";)"));
        if (dir.find("/fsdp-conform.") != std::string::npos) std::filesystem::remove_all(dir);
      }
    }
  }
}

TEST(DriverSession, TheProbeTellsSessionDriversFromOneShotOnes) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not available";
  SessionDriverDir dir;
  EXPECT_TRUE(DriverServesSessions({dir.Driver()}));
  std::string why;
  EXPECT_FALSE(DriverServesSessions({dir.Driver("TOY_DRIVER_NO_SESSIONS=1")},
                                    std::chrono::seconds(60), &why));
  EXPECT_THAT(why, HasSubstr("exited with status 2"));
  EXPECT_FALSE(DriverServesSessions({"/bin/true"}, std::chrono::seconds(60), &why));
  EXPECT_THAT(why, HasSubstr("not JSON"));
}

TEST(DriverSession, OneProcessPerRankServesEveryCaseOfAWorld) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not available";
  SessionDriverDir dir;
  RunOptions o = ToySumOptions(dir.Driver(), 3);
  o.determinism = DeterminismCheck::kNone;
  Runner runner(ToyCatalog(), o);
  const std::vector<CaseResult> results = runner.RunAll();
  ASSERT_EQ(results.size(), 2u);  // mode=plain, mode=doubled
  for (const auto& r : results) EXPECT_EQ(r.status, CaseStatus::kPassed) << Dump(r);
  EXPECT_TRUE(runner.driver_sessions_used());
  std::set<int> all;
  for (int r = 0; r < 3; ++r) {
    const std::vector<int> pids = dir.Pids(r);
    ASSERT_EQ(pids.size(), results.size()) << "rank " << r;
    EXPECT_EQ(std::set<int>(pids.begin(), pids.end()).size(), 1u) << "rank " << r;
    all.insert(pids.front());
    EXPECT_FALSE(Alive(pids.front())) << "rank " << r << " outlived the run";
  }
  EXPECT_EQ(all.size(), 3u);
}

TEST(DriverSession, ARankWhoseTeardownHangsEndsTheSessionAndKeepsItsVerdict) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not available";
  SessionDriverDir dir;
  // Rank 1's teardown after the first case never returns: the kit gives up after 0.5 s, writes
  // the (good) result asking to end the session and exits; the next case gets a fresh session.
  RunOptions o = ToySumOptions(dir.Driver("TOY_DRIVER_FAULT=teardown_hang:1"), 2);
  o.determinism = DeterminismCheck::kNone;
  Runner runner(ToyCatalog(), o);
  const auto started = std::chrono::steady_clock::now();
  const std::vector<CaseResult> results = runner.RunAll();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) EXPECT_EQ(r.status, CaseStatus::kPassed) << Dump(r);
  EXPECT_LT(seconds, 15.0) << "a hung teardown held the next case";
  for (int r = 0; r < 2; ++r) {
    const std::vector<int> pids = dir.Pids(r);
    ASSERT_EQ(pids.size(), 2u) << "rank " << r;
    EXPECT_NE(pids[0], pids[1]) << "rank " << r << ": the second case reused the ended session";
    for (int pid : pids) EXPECT_FALSE(Alive(pid)) << "rank " << r << " outlived the run";
  }
}

TEST(DriverSession, SessionsOffStartsOneProcessPerRankPerCase) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not available";
  SessionDriverDir dir;
  RunOptions o = ToySumOptions(dir.Driver(), 2);
  o.determinism = DeterminismCheck::kNone;
  o.driver_sessions = false;
  Runner runner(ToyCatalog(), o);
  const std::vector<CaseResult> results = runner.RunAll();
  for (const auto& r : results) EXPECT_EQ(r.status, CaseStatus::kPassed) << Dump(r);
  EXPECT_FALSE(runner.driver_sessions_used());
  const std::vector<int> pids = dir.Pids(0);
  EXPECT_EQ(std::set<int>(pids.begin(), pids.end()).size(), results.size());
}

TEST(DriverSession, ALargerWorldGetsANewSessionAndSmallerOnesReuseIt) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not available";
  SessionDriverDir dir;
  SessionLauncher launcher({dir.Driver()});
  const Scenario& sum = ToyCatalog().scenarios.Get("toy/sum");
  for (int world : {1, 2, 2, 1}) {  // sessions of 1, then 2 ranks
    LaunchRequest request;
    request.scenario = &sum;
    request.params = CaseParams({{"mode", "plain"}, {"scale", "3"}, {"bias", "0"}});
    request.world = world;
    request.backend = "gloo";
    request.timeout = std::chrono::milliseconds(20000);
    const std::vector<RankOutcome> outcomes = launcher.Launch(request);
    ASSERT_EQ(static_cast<int>(outcomes.size()), world);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(outcomes[r].status, RankOutcome::Status::kOk) << outcomes[r].Describe(r);
    }
  }
  EXPECT_EQ(launcher.sessions_started(), 2);
}

TEST(DriverSession, ARankThatDiesFailsTheCaseAndTheNextCaseGetsAFreshSession) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not available";
  SessionDriverDir dir;
  RunOptions o = ToySumOptions(dir.Driver("TOY_DRIVER_FAULT=exit:1:7"), 2);
  o.determinism = DeterminismCheck::kNone;
  const std::vector<CaseResult> results = Runner(ToyCatalog(), o).RunAll();
  RemoveKeptFiles(results);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].status, CaseStatus::kFailed);
  ASSERT_FALSE(results[0].errors.empty());
  const std::string errors = ::testing::PrintToString(results[0].errors);
  EXPECT_THAT(errors, HasSubstr("rank 1: Internal: the driver session's rank 1"));
  EXPECT_THAT(errors, HasSubstr("exited with status 7 while serving scenario toy/sum"));
  EXPECT_EQ(results[1].status, CaseStatus::kPassed) << Dump(results[1]);
  // Rank 1 recorded both cases (rank 0 may have been stopped before it read the first).
  const std::vector<int> pids = dir.Pids(1);
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_NE(pids[0], pids[1]);  // the second case ran in a new session
  for (int r = 0; r < 2; ++r) {
    for (int pid : dir.Pids(r)) EXPECT_FALSE(Alive(pid)) << "pid " << pid << " outlived the run";
  }
}

TEST(DriverSession, AHungRankIsKilledAtTheDeadlineAndTheRunGoesOn) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not available";
  SessionDriverDir dir;
  RunOptions o = ToySumOptions(dir.Driver("TOY_DRIVER_FAULT=hang:0"), 2);
  o.determinism = DeterminismCheck::kNone;
  o.timeout = std::chrono::milliseconds(3000);
  const std::vector<CaseResult> results = Runner(ToyCatalog(), o).RunAll();
  RemoveKeptFiles(results);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].status, CaseStatus::kFailed);
  EXPECT_THAT(::testing::PrintToString(results[0].errors),
              HasSubstr("rank 0: DeadlineExceeded: scenario toy/sum rank 0 did not finish"));
  EXPECT_EQ(results[1].status, CaseStatus::kPassed) << Dump(results[1]);
  for (int r = 0; r < 2; ++r) {
    for (int pid : dir.Pids(r)) EXPECT_FALSE(Alive(pid)) << "pid " << pid << " outlived the run";
  }
}

TEST(DriverSession, WorldsAboveMaxDriverRanksAreSkippedSayingSo) {
  RunOptions o = ToySumOptions("/bin/true", 4);
  o.max_driver_ranks = 2;
  Runner runner(ToyCatalog(), o);
  const std::vector<PlannedCase> plan = runner.Plan();
  ASSERT_FALSE(plan.empty());
  for (const auto& pc : plan) {
    ASSERT_TRUE(pc.skip_reason.has_value());
    EXPECT_EQ(*pc.skip_reason,
              "world 4 would start 4 driver processes at once; --max-driver-ranks allows 2");
  }
}

}  // namespace
}  // namespace fsdp::conformance
