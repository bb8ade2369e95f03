#include "tools/launch/local_launcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "engine/core/error.h"

namespace fsdp::bench {
namespace {

std::string MessageOf(const std::vector<std::string>& args) {
  try {
    ParseLocalLaunchArgs(args);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.message();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(LocalLauncherArgsTest, ParsesFlagsInBothSpellings) {
  auto o = ParseLocalLaunchArgs({"--nproc-per-node", "4", "--nnodes=2", "--node_rank", "1",
                                 "--master-addr", "10.0.0.1", "--master_port=29500", "--timeout-ms",
                                 "5000", "--no-prefix", "--", "prog", "-x", "--y"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(5000));
  EXPECT_FALSE(o.prefix_output);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "-x", "--y"}));
}

TEST(LocalLauncherArgsTest, ProgramMayFollowTheFlagsWithoutDashDash) {
  auto o = ParseLocalLaunchArgs({"--nproc_per_node=2", "--standalone", "train.py", "--lr", "1"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.command, (std::vector<std::string>{"train.py", "--lr", "1"}));
  EXPECT_TRUE(o.prefix_output);
}

TEST(LocalLauncherArgsTest, ErrorsNameTheFlag) {
  EXPECT_NE(MessageOf({"--nproc-per-node", "2", "--bogus", "--", "p"}).find("--bogus"),
            std::string::npos);
  EXPECT_NE(MessageOf({"--nproc-per-node", "zero", "--", "p"}).find("--nproc-per-node"),
            std::string::npos);
  EXPECT_NE(MessageOf({"--nproc-per-node", "0", "--", "p"}).find("--nproc-per-node"),
            std::string::npos);
  EXPECT_NE(MessageOf({"--nproc-per-node", "2", "--master-port", "70000", "--", "p"})
                .find("--master-port"),
            std::string::npos);
  EXPECT_NE(MessageOf({"--nproc-per-node"}).find("needs a value"), std::string::npos);
  EXPECT_NE(MessageOf({"--", "p"}).find("--nproc-per-node is required"), std::string::npos);
  EXPECT_NE(MessageOf({"--nproc-per-node", "2"}).find("no program"), std::string::npos);
  EXPECT_NE(MessageOf({"--nproc-per-node", "2", "--no-prefix=1", "--", "p"}).find("--no-prefix"),
            std::string::npos);
  EXPECT_NE(MessageOf({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "--", "p"})
                .find("--node-rank"),
            std::string::npos);
  EXPECT_NE(MessageOf({"--nproc-per-node", "2", "--nnodes", "2", "--", "p"}).find("rendezvous"),
            std::string::npos);
  // A repeated option (in either spelling) is refused rather than the last one silently winning.
  EXPECT_NE(MessageOf({"--nproc-per-node", "2", "--nproc_per_node=4", "--", "p"})
                .find("--nproc-per-node is given twice"),
            std::string::npos);
  bool help = false;
  ParseLocalLaunchArgs({"--help"}, &help);
  EXPECT_TRUE(help);
}

TEST(LocalLauncherArgsTest, ChildVariablesFollowTorchrun) {
  LocalLaunchOptions o;
  o.nproc_per_node = 2;
  o.nnodes = 2;
  o.node_rank = 1;
  std::map<std::string, std::string> vars;
  for (const auto& [k, v] : ChildLaunchVariables(o, 1, "node0", 29500, "/mnt/nfs/store"))
    vars[k] = v;
  EXPECT_EQ(vars["RANK"], "3");
  EXPECT_EQ(vars["WORLD_SIZE"], "4");
  EXPECT_EQ(vars["LOCAL_RANK"], "1");
  EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(vars["GROUP_RANK"], "1");
  EXPECT_EQ(vars["MASTER_ADDR"], "node0");
  EXPECT_EQ(vars["MASTER_PORT"], "29500");
  EXPECT_EQ(vars["FSDP_STORE_PATH"], "/mnt/nfs/store");
  std::map<std::string, std::string> tcp;
  for (const auto& [k, v] : ChildLaunchVariables(o, 0, "node0", 29500, "")) tcp[k] = v;
  EXPECT_EQ(tcp.count("FSDP_STORE_PATH"), 0u);
  EXPECT_EQ(tcp.count("FSDP_CHECK_COLLECTIVES"), 0u);
  o.check_collectives = true;  // --check-collectives
  std::map<std::string, std::string> checked;
  for (const auto& [k, v] : ChildLaunchVariables(o, 0, "node0", 29500, "")) checked[k] = v;
  EXPECT_EQ(checked["FSDP_CHECK_COLLECTIVES"], "1");
  EXPECT_TRUE(ParseLocalLaunchArgs({"--nproc-per-node", "2", "--check-collectives", "--", "p"})
                  .check_collectives);
  EXPECT_THROW(ChildLaunchVariables(o, 2, "node0", 1, ""), Error);
}

// Runs a world of `sh -c script` ranks; returns the exit status and what was written.
struct ScriptRun {
  int status = 0;
  std::string out, err;
  double seconds = 0;
};

std::string ReadAll(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) s.append(buf, n);
  return s;
}

ScriptRun RunScript(int nproc, const std::string& script, LocalLaunchOptions o = {}) {
  o.nproc_per_node = nproc;
  o.grace = std::chrono::milliseconds(1000);
  o.command = {"sh", "-c", script};
  FILE* out = std::tmpfile();
  FILE* err = std::tmpfile();
  ScriptRun run;
  const auto t0 = std::chrono::steady_clock::now();
  run.status = RunLocalWorld(o, {fileno(out), fileno(err)});
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.out = ReadAll(out);
  run.err = ReadAll(err);
  std::fclose(out);
  std::fclose(err);
  return run;
}

TEST(LocalLauncherRunTest, EveryRankRunsWithItsVariablesAndPrefixedOutput) {
  const ScriptRun run = RunScript(2,
                                  "echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK\"; echo oops >&2; "
                                  "printf tail");
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("[rank 0] r=0 w=2 l=0\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("[rank 1] r=1 w=2 l=1\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("[rank 1] tail\n"), std::string::npos) << run.out;  // unterminated line
  EXPECT_NE(run.err.find("[rank 0] oops\n"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("[rank 1] oops\n"), std::string::npos) << run.err;
}

TEST(LocalLauncherRunTest, UnprefixedOutputPassesThrough) {
  LocalLaunchOptions o;
  o.prefix_output = false;
  const ScriptRun run = RunScript(1, "echo plain", o);
  EXPECT_EQ(run.status, 0);
  EXPECT_EQ(run.out, "plain\n");
}

TEST(LocalLauncherRunTest, TemporaryStoreExistsDuringTheRunAndIsRemovedAfter) {
  const ScriptRun run = RunScript(2, "test -d \"$FSDP_STORE_PATH\" && echo \"$FSDP_STORE_PATH\"");
  ASSERT_EQ(run.status, 0) << run.err;
  const auto pos = run.out.find("[rank 0] ");
  ASSERT_NE(pos, std::string::npos);
  const std::string path = run.out.substr(pos + 9, run.out.find('\n', pos) - pos - 9);
  EXPECT_FALSE(path.empty());
  EXPECT_FALSE(std::filesystem::exists(path)) << path;
}

TEST(LocalLauncherRunTest, FailingRankStopsTheOthersAndItsStatusIsReturned) {
  const ScriptRun run = RunScript(3, "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 30");
  EXPECT_EQ(run.status, 3);
  EXPECT_LT(run.seconds, 10);
  EXPECT_NE(run.err.find("rank 1 (pid"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("exited with status 3"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("rank 0 was killed by signal 15"), std::string::npos) << run.err;
}

TEST(LocalLauncherRunTest, RankKilledBySignalGives128PlusSignal) {
  const ScriptRun run = RunScript(2, "if [ \"$RANK\" = 0 ]; then kill -KILL $$; fi; sleep 30");
  EXPECT_EQ(run.status, 128 + 9);
  EXPECT_NE(run.err.find("rank 0"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("killed by signal 9"), std::string::npos) << run.err;
}

TEST(LocalLauncherRunTest, MissingProgramFailsWith127) {
  LocalLaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"/nonexistent/fsdp-program"};
  FILE* err = std::tmpfile();
  const int status = RunLocalWorld(o, {fileno(err), fileno(err)});
  const std::string text = ReadAll(err);
  std::fclose(err);
  EXPECT_EQ(status, 127);
  EXPECT_NE(text.find("cannot start /nonexistent/fsdp-program"), std::string::npos) << text;
}

TEST(LocalLauncherRunTest, TimeoutStopsEveryRankWith124) {
  LocalLaunchOptions o;
  o.timeout = std::chrono::milliseconds(300);
  const ScriptRun run = RunScript(2, "sleep 30", o);
  EXPECT_EQ(run.status, 124);
  EXPECT_LT(run.seconds, 10);
  EXPECT_NE(run.err.find("--timeout-ms 300"), std::string::npos) << run.err;
}

}  // namespace
}  // namespace fsdp::bench
