// The process launcher and the driver protocol: ranks as processes of this test binary
// (`conformance_tests __worker`, see main_test.cc) and as external driver programs.
#include "conformance/process_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "conformance/driver_protocol.h"
#include "conformance/runner.h"
#include "conformance/testing/toy_catalog.h"
#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;
using testing::ToyCatalog;

// A temporary directory for driver scripts, removed with the fixture.
class DriverDir {
 public:
  DriverDir() {
    char templ[] = "/tmp/fsdp-conform-test.XXXXXX";
    path_ = ::mkdtemp(templ);
  }
  ~DriverDir() { std::filesystem::remove_all(path_); }
  // Writes an executable /bin/sh script and returns its path.
  std::string Script(const std::string& name, const std::string& body) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << "#!/bin/sh\n" << body;
    ::chmod(p.c_str(), 0755);
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A driver in sh for toy/sum: parses the protocol flags and reports the analytic answer.
constexpr const char* kToySumDriver = R"(
while [ $# -gt 0 ]; do
  case "$1" in
    --rank) rank=$2 ;;
    --world) world=$2 ;;
    --output) output=$2 ;;
    --request) request=$2 ;;
    --param)
      case "$2" in
        mode=doubled) factor=2 ;;
        mode=plain) factor=1 ;;
        scale=*) scale=${2#scale=} ;;
      esac ;;
  esac
  shift 2
done
[ -f "$request" ] || { echo "no request file" >&2; exit 3; }
value=$(( (rank + 1) * scale * factor ))
total=$(( scale * factor * world * (world + 1) / 2 ))
ar=1; [ "$world" -eq 1 ] && ar=0
cat > "$output.tmp" <<JSON
{"status": "ok", "observations": {"value": $value, "total": $total,
 "comm_counts": {"forward": {"allreduce_": $ar}, "backward": {}},
 "tensors": {"v": {"shape": [1], "dtype": "float64", "data": [$value]}}}}
JSON
mv "$output.tmp" "$output"
)";

RunOptions ProcOptions(std::vector<std::string> patterns) {
  RunOptions o;
  o.patterns = std::move(patterns);
  o.backend = testing::kToyProcBackend;
  o.timeout = std::chrono::milliseconds(20000);
  o.failure_grace = std::chrono::milliseconds(300);
  return o;
}

std::vector<CaseResult> RunCases(RunOptions o) {
  Runner runner(ToyCatalog(), std::move(o));
  return runner.RunAll();
}

std::string Dump(const CaseResult& r) { return r.ToJson().dump(2); }

// Removes the run directories that failed cases keep ("(files kept in DIR)").
void RemoveKeptFiles(const CaseResult& r) {
  const std::string marker = "(files kept in ";
  for (const auto& e : r.errors) {
    const size_t at = e.find(marker);
    if (at == std::string::npos) continue;
    const std::string rest = e.substr(at + marker.size());
    const std::string dir = rest.substr(0, rest.find(')'));
    if (dir.find("/fsdp-conform.") != std::string::npos) {
      std::filesystem::remove_all(dir);
    }
  }
}

std::vector<CaseResult> RunAndClean(RunOptions o) {
  auto results = RunCases(std::move(o));
  for (const auto& r : results) RemoveKeptFiles(r);
  return results;
}

TEST(DriverRequest, ArgsRoundTrip) {
  DriverRequest r;
  r.scenario = "fam/case";
  r.params = {{"a", "True"}, {"n", "2"}};
  r.rank = 2;
  r.world = 4;
  r.backend = "gloo";
  r.store_dir = "/tmp/s";
  r.output = "/tmp/o.json";
  r.request_file = "/tmp/r.json";
  r.timeout_s = 12.5;
  r.subject = "engine";
  r.tensors_output = "/tmp/t.safetensors";
  r.inputs = {{"weights", "/tmp/w.safetensors"}, {"rank", "/tmp/rank2.inputs.safetensors"}};
  const std::vector<std::string> args = r.ToArgs();
  EXPECT_EQ(args[0], "--protocol");
  EXPECT_EQ(args[1], "2");
  const DriverRequest back = DriverRequest::FromArgs(args);
  EXPECT_EQ(back.ToJson(), r.ToJson());
}

TEST(DriverRequest, FromArgsIsStrict) {
  auto err = [](std::vector<std::string> args) {
    try {
      DriverRequest::FromArgs(args);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  DriverRequest r;
  r.scenario = "f/c";
  r.backend = "gloo";
  r.store_dir = "s";
  r.output = "o";
  r.request_file = "q";
  std::vector<std::string> args = r.ToArgs();
  EXPECT_EQ(err(args), "");
  auto with = [&](std::vector<std::string> extra) {
    auto a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  EXPECT_THAT(err(with({"--color", "x"})), HasSubstr("unknown flag '--color'"));
  EXPECT_THAT(err(with({"--rank", "0"})), HasSubstr("--rank given twice"));
  EXPECT_THAT(err(with({"--param"})), HasSubstr("--param needs a value"));
  EXPECT_THAT(err({"--scenario", "f/c"}), HasSubstr("missing --protocol"));
  EXPECT_THAT(err(with({"--input", "rank=a", "--input", "rank=b"})),
              HasSubstr("--input rank given twice"));
  auto bad_protocol = args;
  bad_protocol[1] = "1";
  EXPECT_THAT(err(bad_protocol), HasSubstr("version 1 is not supported"));
  // Found by fuzz_driver_request_args: a timeout too long to write back did not round-trip.
  auto huge_timeout = args;
  const auto timeout_flag = std::find(huge_timeout.begin(), huge_timeout.end(), "--timeout-s");
  ASSERT_NE(timeout_flag, huge_timeout.end());
  *(timeout_flag + 1) = std::string(118, '9') + ".000";
  EXPECT_THAT(err(huge_timeout), HasSubstr("--timeout-s expects seconds in (0, 1e+09]"));
  auto bad_rank = args;
  bad_rank[5] = "1";  // rank 1 of world 1
  EXPECT_THAT(err(bad_rank), HasSubstr("rank 1 is outside world 1"));
}

// A result path that is not a regular file (a FIFO would block a plain read) is refused at
// once, naming the path.
TEST(DriverResult, AResultThatIsNotARegularFileIsRefused) {
  const std::string fifo = (std::filesystem::temp_directory_path() /
                            ("fsdp-result-fifo." + std::to_string(::getpid())))
                               .string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const RankOutcome outcome = ReadRankResult(fifo, "", "rank 0");
  std::filesystem::remove(fifo);
  EXPECT_EQ(outcome.status, RankOutcome::Status::kError);
  EXPECT_EQ(outcome.code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(outcome.message, HasSubstr(fifo + " is not a regular file"));
}

// A result nested 100,000 deep (which would exhaust the stack of anything recursing over it)
// is refused at the depth limit; an error message of megabytes is cut to the limit.
TEST(DriverResult, DeepNestingIsRefusedAndLongMessagesAreCut) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("fsdp-result-deep." + std::to_string(::getpid())))
          .string();
  {
    std::ofstream out(path);
    out << R"({"status": "ok", "observations": {"x": )" << std::string(100000, '[')
        << std::string(100000, ']') << "}}";
  }
  const RankOutcome deep = ReadRankResult(path, "", "rank 0");
  EXPECT_EQ(deep.status, RankOutcome::Status::kError);
  EXPECT_EQ(deep.code, ErrorCode::kDataLoss);
  EXPECT_THAT(deep.message, HasSubstr("nesting deeper than 64 levels"));
  EXPECT_THAT(deep.message, HasSubstr(path));
  {
    std::ofstream out(path);
    out << nlohmann::json{{"status", "error"},
                          {"error",
                           {{"code", "Internal"}, {"message", std::string(50 << 20, 'm')}}}}
               .dump();
  }
  const RankOutcome chatty = ReadRankResult(path, "", "rank 0");
  std::filesystem::remove(path);
  EXPECT_EQ(chatty.status, RankOutcome::Status::kError);
  EXPECT_LT(chatty.message.size(), kMaxResultMessageBytes + 64);
  EXPECT_THAT(chatty.message,
              HasSubstr(std::to_string((50 << 20) - kMaxResultMessageBytes) + " more bytes cut"));
  // Nesting up to the limit is accepted.
  std::string ok_text = "{\"status\": \"ok\", \"observations\": {\"x\": " + std::string(60, '[') +
                        std::string(60, ']') + "}}";
  EXPECT_EQ(ParseResult(ParseBoundedJson(ok_text), "r").status, RankOutcome::Status::kOk);
}

TEST(DriverResult, ParseResultFollowsTheProtocol) {
  const RankOutcome ok = ParseResult({{"status", "ok"}, {"observations", {{"x", 1}}}}, "rank 0");
  EXPECT_EQ(ok.status, RankOutcome::Status::kOk);
  EXPECT_EQ(ok.observations["x"], 1);
  const RankOutcome skipped = ParseResult({{"status", "skipped"}, {"reason", "no TP"}}, "rank 0");
  EXPECT_EQ(skipped.status, RankOutcome::Status::kSkipped);
  EXPECT_EQ(skipped.message, "no TP");
  const RankOutcome error = ParseResult(
      {{"status", "error"}, {"error", {{"code", "FailedPrecondition"}, {"message", "m"}}}}, "r");
  EXPECT_EQ(error.status, RankOutcome::Status::kError);
  EXPECT_EQ(error.code, ErrorCode::kFailedPrecondition);
  const RankOutcome odd_code =
      ParseResult({{"status", "error"}, {"error", {{"code", "Weird"}, {"message", "m"}}}}, "r");
  EXPECT_EQ(odd_code.code, ErrorCode::kInternal);
  EXPECT_THROW(ParseResult({{"status", "ok"}}, "r"), Error);
  EXPECT_THROW(ParseResult({{"status", "done"}}, "r"), Error);
  EXPECT_THROW(ParseResult({{"status", "skipped"}}, "r"), Error);
  EXPECT_THROW(ParseResult({{"protocol", 7}, {"status", "ok"}, {"observations", {}}}, "r"), Error);
  EXPECT_THROW(ParseResult(nlohmann::json::array(), "r"), Error);
  for (const RankOutcome& o : {ok, skipped, error}) {
    EXPECT_EQ(ParseResult(ResultJson(o), "r").status, o.status);
  }
}

TEST(ProcessLauncher, WorkersOfThisBinaryRunToySum) {
  for (int world : {1, 3}) {
    RunOptions o = ProcOptions({"toy/sum"});
    o.world = world;
    o.params = {{"mode", "doubled"}};
    const auto results = RunCases(o);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].status, CaseStatus::kPassed) << Dump(results[0]);
    EXPECT_EQ(results[0].backend, "toyproc");
    EXPECT_EQ(results[0].observations.size(), static_cast<size_t>(world));
  }
}

TEST(ProcessLauncher, GlooBackendRunsToySum) {
  for (int world : {2, 3}) {
    RunOptions o = ProcOptions({"toy/sum"});
    o.backend = kBackendGloo;
    o.world = world;
    o.params = {{"mode", "plain"}};
    const auto results = RunAndClean(o);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].status, CaseStatus::kPassed) << Dump(results[0]);
  }
}

TEST(ProcessLauncher, WorkerErrorCarriesTheLogAndPeersAreStopped) {
  RunOptions o = ProcOptions({"toy/flaws"});
  o.world = 2;
  o.params = {{"flaw", "rank_error"}, {"bad_rank", "1"}};
  const auto results = RunAndClean(o);
  ASSERT_EQ(results.size(), 1u);
  const CaseResult& r = results[0];
  EXPECT_EQ(r.status, CaseStatus::kFailed);
  ASSERT_EQ(r.errors.size(), 2u) << Dump(r);
  EXPECT_THAT(r.errors[1], HasSubstr("rank 1: FailedPrecondition: toy failure on rank 1"));
  EXPECT_THAT(r.errors[1], HasSubstr("| rank 1 is about to fail"));  // the log tail
  EXPECT_THAT(r.errors[1], HasSubstr("files kept in"));
  // Rank 0 waits in the toy barrier: stopped after the grace period, or it timed out itself.
  EXPECT_THAT(r.errors[0], ::testing::AnyOf(HasSubstr("Aborted"), HasSubstr("DeadlineExceeded")));
}

TEST(ProcessLauncher, StragglersAreKilledAtTheDeadline) {
  RunOptions o = ProcOptions({"toy/flaws"});
  o.world = 2;
  o.params = {{"flaw", "sleep"}, {"sleep_ms", "10000"}};
  o.timeout = std::chrono::milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  const auto results = RunAndClean(o);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(results.size(), 1u);
  ASSERT_EQ(results[0].errors.size(), 2u) << Dump(results[0]);
  EXPECT_THAT(results[0].errors[0], HasSubstr("DeadlineExceeded"));
  EXPECT_THAT(results[0].errors[0], HasSubstr("did not finish within 0.3 s; killed"));
}

// The runner's straggler timeout: 1% of the case's timeout within [2 s, 10 s], never more than
// half the timeout, so that a missing rank is named well before the deadline; scaled for a world
// that oversubscribes the cores, up to a quarter of the timeout.
TEST(ProcessLauncher, StragglerTimeoutIsDerivedFromTheCaseTimeout) {
  using std::chrono::milliseconds;
  for (int64_t timeout_ms : {1, 300, 1000, 4000, 60000, 300000, 1000000, 100000000}) {
    const milliseconds timeout(timeout_ms);
    for (int world : {1, 3, 4, 128}) {
      const milliseconds s = StragglerTimeoutOf(timeout, world, 2);
      EXPECT_GT(s.count(), 0) << timeout_ms;
      EXPECT_LE(s, std::max(timeout / 2, milliseconds(1))) << timeout_ms;
      const milliseconds base = std::clamp(timeout / 100, milliseconds(2000), milliseconds(10000));
      if (timeout >= milliseconds(4000) && world <= 4) EXPECT_EQ(s, base) << timeout_ms;
      if (timeout >= milliseconds(4000) && world == 128) {
        // 32 ranks per core pair: 32 x the base, at most a quarter of the timeout.
        EXPECT_EQ(s, std::min(base * 32, std::max(base, timeout / 4))) << timeout_ms;
      }
    }
  }
  EXPECT_EQ(StragglerTimeoutOf(milliseconds(300000), 3, 2), milliseconds(3000));
  EXPECT_EQ(StragglerTimeoutOf(milliseconds(300000), 8, 2), milliseconds(6000));
  EXPECT_EQ(StragglerTimeoutOf(milliseconds(300000), 8, 4), milliseconds(3000));
  EXPECT_EQ(StragglerTimeoutOf(milliseconds(300000), 128, 2), milliseconds(75000));
}

// A rank stopped at the deadline writes its flight recorder into the kept run directory on
// its way out (SIGTERM), and the report names the file.
TEST(ProcessLauncher, StoppedRanksLeaveTheirFlightRecorderNamedInTheReport) {
  RunOptions o = ProcOptions({"toy/flaws"});
  o.world = 2;
  o.params = {{"flaw", "sleep"}, {"sleep_ms", "10000"}};
  // Long enough for both workers to start (and install their recorders) on a loaded machine.
  o.timeout = std::chrono::milliseconds(3000);
  const auto results = RunCases(o);
  ASSERT_EQ(results.size(), 1u);
  ASSERT_EQ(results[0].errors.size(), 2u) << Dump(results[0]);
  for (int r = 0; r < 2; ++r) {
    const std::string& error = results[0].errors[r];
    const std::string name = "rank" + std::to_string(r) + ".flight_recorder.txt";
    const size_t at = error.find("(its last collectives: ");
    ASSERT_NE(at, std::string::npos) << error;
    const size_t begin = at + std::string("(its last collectives: ").size();
    const std::string path = error.substr(begin, error.find(')', begin) - begin);
    EXPECT_THAT(path, ::testing::EndsWith(name));
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_THAT(text, HasSubstr("rank " + std::to_string(r) + " flight recorder (stopped by "
                                "SIGTERM)"));
  }
  for (const auto& r : results) RemoveKeptFiles(r);
}

TEST(ExternalDriver, ShellDriverPassesOnOneAndFourRanks) {
  DriverDir dir;
  const std::string driver = dir.Script("toy_driver.sh", kToySumDriver);
  for (int world : {1, 4}) {
    RunOptions o = ProcOptions({"toy/sum"});
    o.backend.reset();  // external defaults to gloo, which toy/sum lists
    o.subject = kExternalSubject;
    o.driver = driver;
    o.world = world;
    const auto results = RunCases(o);
    ASSERT_EQ(results.size(), 2u);
    for (const auto& r : results) {
      EXPECT_EQ(r.status, CaseStatus::kPassed) << Dump(r);
      EXPECT_EQ(r.backend, "gloo");
      EXPECT_EQ(r.subject, "external");
    }
  }
}

TEST(ExternalDriver, WrongAnswersAndBrokenDriversFail) {
  DriverDir dir;
  RunOptions o = ProcOptions({"toy/sum"});
  o.subject = kExternalSubject;
  o.world = 2;
  o.params = {{"mode", "plain"}};
  auto run_with = [&](const std::string& name, const std::string& body) {
    RunOptions copy = o;
    copy.driver = dir.Script(name, body);
    auto results = RunAndClean(copy);
    EXPECT_EQ(results.size(), 1u);
    return results.at(0);
  };
  {  // a wrong answer is judged like any subject's
    RunOptions copy = o;
    copy.driver = dir.Script("d.sh", kToySumDriver);
    copy.params["bias"] = "5";
    const auto results = RunCases(copy);
    EXPECT_EQ(results.at(0).status, CaseStatus::kFailed);
    EXPECT_TRUE(results.at(0).errors.empty());
    EXPECT_GT(results.at(0).checks.failed_count(), 0);
  }
  const std::string out_of =
      "while [ $# -gt 0 ]; do [ \"$1\" = --output ] && out=$2; shift 2; done\n";
  {
    const CaseResult r = run_with("garbage.sh", out_of + "echo '{oops' > \"$out\"\n");
    ASSERT_EQ(r.errors.size(), 2u);
    EXPECT_THAT(r.errors[0], HasSubstr("DataLoss: rank 0 wrote unreadable JSON"));
  }
  {
    const CaseResult r = run_with("crash.sh", "echo 'driver crashed' >&2\nexit 7\n");
    EXPECT_THAT(r.errors.at(0), HasSubstr("exited with status 7 without writing"));
    EXPECT_THAT(r.errors.at(0), HasSubstr("| driver crashed"));
  }
  {
    const CaseResult r = run_with(
        "skip.sh",
        out_of + "echo '{\"status\": \"skipped\", \"reason\": \"no FSDP1\"}' > \"$out\"\n");
    EXPECT_EQ(r.status, CaseStatus::kSkipped);
    EXPECT_EQ(r.skip_reason, "rank 0: no FSDP1");
  }
  {
    const CaseResult r = run_with(
        "error.sh", out_of +
                        "echo '{\"status\": \"error\", \"error\": {\"code\": "
                        "\"InvalidArgument\", \"message\": \"bad shape\"}}' > \"$out\"\nexit 1\n");
    EXPECT_EQ(r.status, CaseStatus::kFailed);
    EXPECT_THAT(r.errors.at(0), HasSubstr("rank 0: InvalidArgument: bad shape"));
  }
  {
    const CaseResult r = run_with(
        "notjson.sh",
        out_of + "echo '{\"status\": \"ok\", \"observations\": {\"losses\": 3}}' > \"$out\"\n");
    EXPECT_THAT(r.errors.at(0), HasSubstr("DataLoss: rank 0: losses must be an array"));
  }
}

TEST(ExternalDriver, DriverMustBeExecutable) {
  RunOptions o = ProcOptions({"toy/sum"});
  o.subject = kExternalSubject;
  o.driver = "/nonexistent/driver";
  Runner runner(ToyCatalog(), o);
  try {
    runner.Plan();
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), HasSubstr("--driver /nonexistent/driver is not an executable file"));
  }
}

}  // namespace
}  // namespace fsdp::conformance
