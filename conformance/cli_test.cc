#include "conformance/cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "conformance/testing/toy_catalog.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct CliResult {
  int code;
  std::string out;
  std::string err;
};

CliResult Cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = RunCli(args, testing::ToyCatalog(), out, err);
  return {code, out.str(), err.str()};
}

std::string LastLine(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
}

TEST(Cli, UsageWithoutArgumentsAndWithHelp) {
  const CliResult none = Cli({});
  EXPECT_EQ(none.code, kExitUsage);
  EXPECT_THAT(none.out, StartsWith("usage: fsdp-conform"));
  for (auto args :
       std::vector<std::vector<std::string>>{{"--help"}, {"-h"}, {"help"}, {"run", "--help"}}) {
    const CliResult help = Cli(args);
    EXPECT_EQ(help.code, kExitOk);
    EXPECT_THAT(help.out, HasSubstr("--param KEY=VALUE"));
  }
  const CliResult unknown = Cli({"frobnicate"});
  EXPECT_EQ(unknown.code, kExitUsage);
  EXPECT_THAT(unknown.err, HasSubstr("unknown command 'frobnicate' (commands: list, run, schema, expect, check, help)"));
}

TEST(Cli, ListShowsScenariosParametersAndBackends) {
  const CliResult r = Cli({"list"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("toy/sum\n"));
  EXPECT_THAT(r.out, HasSubstr("seed: toy_test.py::TestToy::test_sum"));
  EXPECT_THAT(r.out, HasSubstr("world 4 (range 1..8), requires any backend, backends gloo,nccl,threaded,toyproc"));
  EXPECT_THAT(r.out, HasSubstr("--param mode   axis  plain|doubled (all unless fixed)"));
  EXPECT_THAT(r.out, HasSubstr("--param scale  size  an int >= 0, default 3"));
  EXPECT_THAT(r.out, HasSubstr("4 scenario(s)"));
  EXPECT_THAT(r.out, HasSubstr("gloo (processes, cpu):"));
  EXPECT_THAT(r.out, HasSubstr("threaded (threads, cpu):"));
  // Unavailable here either way: no NCCL in the build, or no CUDA device visible.
  EXPECT_THAT(r.out, ::testing::AnyOf(HasSubstr("unavailable: backend nccl has no process-group factory"),
                                      HasSubstr("unavailable: backend nccl: no CUDA device visible")));
  EXPECT_THAT(r.out, HasSubstr("subjects: engine, external (--driver PATH)"));
  const CliResult filtered = Cli({"list", "toy/m*"});
  EXPECT_THAT(filtered.out, HasSubstr("toy/matrix"));
  EXPECT_THAT(filtered.out, ::testing::Not(HasSubstr("toy/sum")));
}

TEST(Cli, ListJson) {
  const CliResult r = Cli({"list", "--json"});
  ASSERT_EQ(r.code, kExitOk);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["scenarios"].size(), 4u);
  const nlohmann::json& sum = j["scenarios"][3];
  EXPECT_EQ(sum["name"], "toy/sum");
  EXPECT_EQ(sum["family"], "toy");
  EXPECT_EQ(sum["default_world"], 4);
  EXPECT_EQ(sum["min_world"], 1);
  EXPECT_EQ(sum["max_world"], 8);
  EXPECT_EQ(sum["requires_gpu"], false);
  EXPECT_EQ(sum["backends"], nlohmann::json::array({"gloo", "nccl", "threaded", "toyproc"}));
  EXPECT_EQ(sum["params"][0], (nlohmann::json{{"name", "mode"},
                                              {"description", "plain or doubled contribution"},
                                              {"kind", "axis"},
                                              {"type", "string"},
                                              {"values", {"plain", "doubled"}},
                                              {"default", "all"}}));
  EXPECT_EQ(sum["params"][1]["default"], "3");
  EXPECT_EQ(j["subjects"], nlohmann::json::array({"engine", "external"}));
  bool saw_threaded = false;
  for (const auto& b : j["backends"]) {
    if (b["name"] == "threaded") {
      saw_threaded = true;
      EXPECT_EQ(b["available"], true);
      EXPECT_EQ(b["mode"], "threads");
    }
    if (b["name"] == "nccl") EXPECT_TRUE(b.contains("unavailable_reason"));
  }
  EXPECT_TRUE(saw_threaded);
}

TEST(Cli, RunPrintsATableAndTheSummaryLast) {
  const CliResult r = Cli({"run", "toy/sum", "toy/matrix", "--world", "2"});
  EXPECT_EQ(r.code, kExitOk) << r.out << r.err;
  EXPECT_THAT(r.out, StartsWith("SCENARIO"));
  EXPECT_THAT(r.out, HasSubstr("toy/sum     mode=plain    threaded  2      PASS"));
  EXPECT_EQ(LastLine(r.out), "7 passed, 0 failed, 0 skipped");
  EXPECT_EQ(r.err, "");
}

TEST(Cli, RunRecordsTheSemanticsProfile) {
  const CliResult table = Cli({"run", "toy/sum", "--world", "2"});
  EXPECT_EQ(table.code, kExitOk) << table.err;
  EXPECT_THAT(table.out, HasSubstr("\nsemantics: torch-2.4\n2 passed, 0 failed, 0 skipped\n"));
  const CliResult json = Cli({"run", "toy/sum", "--world", "2", "--semantics", "torch-2.8",
                              "--json", "-"});
  ASSERT_EQ(json.code, kExitOk) << json.err;
  EXPECT_THAT(json.err, HasSubstr("\nsemantics: torch-2.8\n"));
  EXPECT_EQ(nlohmann::json::parse(json.out)["semantics"], "torch-2.8");
  const CliResult list = Cli({"list"});
  EXPECT_THAT(list.out,
              HasSubstr("semantics: torch-2.4, torch-2.8, torch-2.15 (default torch-2.4)"));
  const CliResult list_json = Cli({"list", "--json"});
  EXPECT_EQ(nlohmann::json::parse(list_json.out)["semantics"],
            nlohmann::json::array({"torch-2.4", "torch-2.8", "torch-2.15"}));
  const CliResult unknown = Cli({"run", "toy/sum", "--semantics", "torch-2.6"});
  EXPECT_EQ(unknown.code, kExitUsage);
  EXPECT_THAT(unknown.err, HasSubstr("unknown FSDP semantics 'torch-2.6'"));
  EXPECT_EQ(unknown.out, "");
}

// Cases run at once keep the plan's order in the table and the report, and judge the same.
TEST(Cli, RunWithSeveralJobsReportsWhatOneJobDoes) {
  auto report = [](const std::string& jobs) {
    const CliResult r = Cli({"run", "toy/*", "--json", "-", "--jobs", jobs});
    nlohmann::json j = nlohmann::json::parse(r.out);
    for (auto& c : j["cases"]) c.erase("seconds");
    return std::make_pair(r.code, j);
  };
  const auto [code1, one] = report("1");
  const auto [code4, four] = report("4");
  EXPECT_EQ(code1, code4);
  EXPECT_GT(one["cases"].size(), 5u);
  EXPECT_EQ(one, four);
}

TEST(Cli, RunFailureExitsNonZeroWithDetails) {
  const CliResult r =
      Cli({"run", "toy/sum", "--param", "bias=2", "--param=mode=plain", "--world=2"});
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_THAT(r.out, HasSubstr("toy/sum   mode=plain,bias=2  threaded  2      FAIL"));
  EXPECT_THAT(r.out, HasSubstr("FAIL"));
  EXPECT_THAT(r.out, HasSubstr("rank 1 total"));
  EXPECT_EQ(LastLine(r.out), "0 passed, 1 failed, 0 skipped");
}

TEST(Cli, RunSkipsAreCountedAndARunOfSkipsOnlyExitsThree) {
  const CliResult r = Cli({"run", "toy/sum", "--backend", "nccl", "--world", "2"});
  EXPECT_EQ(r.code, kExitNothingJudged);
  EXPECT_THAT(r.out, HasSubstr("SKIP"));
  EXPECT_THAT(r.out, ::testing::AnyOf(HasSubstr("needs a GPU and none is visible"),
                                      HasSubstr("backend nccl has no process-group factory"),
                                      HasSubstr("backend nccl: no CUDA device visible")));
  EXPECT_EQ(LastLine(r.out), "0 passed, 0 failed, 1 skipped");
}

TEST(Cli, RunJsonToStdoutMovesTheTableToStderr) {
  const CliResult r = Cli({"run", "toy/matrix", "--json", "-", "--param", "a=x"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(LastLine(r.err), "3 passed, 0 failed, 0 skipped");
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["summary"], (nlohmann::json{{"passed", 3}, {"failed", 0}, {"skipped", 0}}));
  ASSERT_EQ(j["cases"].size(), 3u);
  for (const auto& c : j["cases"]) {
    for (const char* key : {"name", "subject", "backend", "world", "params", "status", "seconds",
                            "checks", "figures", "errors"}) {
      EXPECT_TRUE(c.contains(key)) << key;
    }
    EXPECT_EQ(c["params"]["a"], "x");
  }
}

TEST(Cli, RunJsonToFile) {
  char path[] = "/tmp/fsdp-conform-cli-test.XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const CliResult r = Cli({"run", "toy/flaws", "--param", "flaw=skip", "--json", path});
  EXPECT_EQ(r.code, kExitNothingJudged);
  EXPECT_EQ(LastLine(r.out), "0 passed, 0 failed, 1 skipped");
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::remove(path);
  ASSERT_EQ(j["cases"].size(), 1u);
  EXPECT_EQ(j["cases"][0]["status"], "skipped");
  EXPECT_EQ(j["cases"][0]["skip_reason"], "rank 0: toy cannot run this here");
}

TEST(Cli, AnUnwritableJsonPathFailsBeforeAnyCaseRuns) {
  const CliResult missing_dir =
      Cli({"run", "toy/sum", "--json", "/nonexistent-fsdp-dir/report.json"});
  EXPECT_EQ(missing_dir.code, kExitUsage);
  EXPECT_THAT(missing_dir.err, HasSubstr("cannot write /nonexistent-fsdp-dir/report.json: "
                                         "directory /nonexistent-fsdp-dir does not exist"));
  EXPECT_EQ(missing_dir.out.find("passed"), std::string::npos) << "cases ran: " << missing_dir.out;
  const CliResult directory = Cli({"run", "toy/sum", "--json", "/tmp"});
  EXPECT_EQ(directory.code, kExitUsage);
  EXPECT_THAT(directory.err, HasSubstr("cannot write /tmp: it is a directory"));
}

TEST(Cli, UsageErrorsNameTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"run"}, "give at least one scenario pattern"},
           {{"run", "nope/*"}, "no scenario matches 'nope/*'; scenarios: toy/flaws"},
           {{"run", "toy/sum", "--backend", "mpi"}, "backends: gloo, nccl, threaded, toyproc"},
           {{"run", "toy/sum", "--param", "n_layers=2"},
            "no matched scenario has parameter 'n_layers'; parameters: toy/sum: mode"},
           {{"run", "toy/sum", "--param", "mode"}, "--param expects KEY=VALUE"},
           {{"run", "toy/sum", "--param", "mode=plain", "--param", "mode=doubled"},
            "--param mode given twice"},
           {{"run", "toy/sum", "--world", "0"}, "--world expects an integer"},
           {{"run", "toy/sum", "--world", "2", "--world", "3"}, "--world given twice"},
           {{"run", "toy/sum", "--timeout", "soon"}, "--timeout expects seconds"},
           {{"run", "toy/sum", "--jobs", "0"}, "--jobs expects an integer in [1, 256], got '0'"},
           {{"run", "toy/sum", "--colour"}, "unknown option '--colour'"},
           {{"run", "toy/sum", "--json"}, "--json needs a value"},
           {{"run", "toy/sum", "--subject", "external"}, "needs --driver PATH"},
           {{"run", "toy/sum", "--subject", "external", "--driver", "/tmp"},
            "--driver /tmp is not an executable file"},
           {{"run", "toy/sum", "--param", "scale=-3"},
            "parameter 'scale' takes an int >= 0; got '-3'"},
           {{"list", "--json=yes"}, "--json takes no value"},
           {{"list", "zzz"}, "no scenario matches 'zzz'"},
       }) {
    const CliResult r = Cli(c.args);
    EXPECT_EQ(r.code, kExitUsage) << c.args.back();
    EXPECT_THAT(r.err, StartsWith("fsdp-conform: error: "));
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(r.out, "") << "nothing runs on a usage error";
  }
}

TEST(Cli, ARunWhoseEveryCaseIsSkippedJudgedNothing) {
  const CliResult r = Cli({"run", "toy/sum", "--world", "9"});
  EXPECT_EQ(r.code, kExitNothingJudged) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("0 passed, 0 failed, 1 skipped"));
  EXPECT_THAT(r.err, HasSubstr("nothing was judged: every selected case was skipped"));
}

TEST(Cli, WorkerRejectsBadFlags) {
  const CliResult r = Cli({"__worker", "--scenario", "toy/sum"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("missing --protocol"));
}

}  // namespace
}  // namespace fsdp::conformance
