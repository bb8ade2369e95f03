// ProcessLauncher with `sh -c` ranks: environment, output sinks, stdin, failure teardown,
// deadline, requested stops, failure grace and spawn errors.
#include "engine/distributed/launch/process_launcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace fsdp::distributed {
namespace {

using namespace std::chrono_literals;

RankCommand Sh(const std::string& script, std::vector<std::pair<std::string, std::string>> env = {}) {
  RankCommand c;
  c.argv = {"sh", "-c", script};
  c.env = std::move(env);
  return c;
}

std::string ReadAll(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) s.append(buf, n);
  return s;
}

TEST(ProcessLauncherTest, RanksSeeTheirVariablesAndOutputIsPrefixed) {
  FILE* out = std::tmpfile();
  std::vector<RankCommand> commands;
  for (int r = 0; r < 2; ++r) {
    RankCommand c = Sh("echo \"r=$R\"; printf tail", {{"R", std::to_string(r)}});
    c.out = OutputSink::PrefixLines("[" + std::to_string(r) + "] ", fileno(out));
    commands.push_back(c);
  }
  const WorldExit world = ProcessLauncher().Run(commands);
  const std::string text = ReadAll(out);
  std::fclose(out);
  EXPECT_TRUE(world.ok());
  EXPECT_EQ(world.first_failed, -1);
  ASSERT_EQ(world.ranks.size(), 2u);
  EXPECT_EQ(world.ranks[1].exit_code(), 0);
  EXPECT_NE(text.find("[0] r=0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("[1] r=1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("[1] tail\n"), std::string::npos) << text;
}

TEST(ProcessLauncherTest, FileSinkTakesStdoutAndStderr) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("fsdp-pl-" + std::to_string(::getpid()))).string();
  RankCommand c = Sh("echo out; echo err >&2");
  c.out = OutputSink::File(path);
  c.err = OutputSink::SameAsStdout();
  EXPECT_TRUE(ProcessLauncher().Run({c}).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "out\nerr\n");
  std::filesystem::remove(path);
}

TEST(ProcessLauncherTest, FirstFailureStopsTheOthersWithSigterm) {
  StopEvent seen;
  ProcessLauncher launcher({.kill_grace = 2000ms, .forward_signals = false});
  launcher.set_on_stop([&](const StopEvent& e, const WorldExit&) { seen = e; });
  const auto t0 = std::chrono::steady_clock::now();
  const WorldExit world =
      launcher.Run({Sh("exec sleep 30"), Sh("exit 3"), Sh("exec sleep 30")});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_FALSE(world.ok());
  EXPECT_EQ(world.first_failed, 1);
  EXPECT_EQ(world.stop_reason, StopReason::kRankFailed);
  EXPECT_EQ(seen.reason, StopReason::kRankFailed);
  EXPECT_EQ(seen.rank, 1);
  EXPECT_TRUE(seen.others_running);
  EXPECT_EQ(world.ranks[1].exit_code(), 3);
  EXPECT_FALSE(world.ranks[1].stopped);
  for (int r : {0, 2}) {
    EXPECT_TRUE(world.ranks[r].stopped);
    EXPECT_EQ(world.ranks[r].exit_code(), 128 + SIGTERM);
    EXPECT_EQ(world.ranks[r].Describe(), "was killed by signal 15 (Terminated)");
  }
}

TEST(ProcessLauncherTest, SigkillFollowsWhenSigtermIsIgnored) {
  ProcessLauncher launcher({.kill_grace = 200ms, .forward_signals = false});
  const WorldExit world =
      launcher.Run({Sh("trap '' TERM; sleep 30 & wait; sleep 30"), Sh("sleep 0.2; exit 1")});
  EXPECT_EQ(world.first_failed, 1);
  EXPECT_TRUE(world.ranks[0].stopped);
  EXPECT_EQ(world.ranks[0].exit_code(), 128 + SIGKILL);
}

TEST(ProcessLauncherTest, FailureGraceLetsTheOthersFinish) {
  ProcessLauncher launcher({.failure_grace = 5000ms, .forward_signals = false});
  const WorldExit world = launcher.Run({Sh("sleep 0.3; exit 0"), Sh("exit 1")});
  EXPECT_EQ(world.first_failed, 1);
  EXPECT_FALSE(world.ranks[0].stopped);
  EXPECT_TRUE(world.ranks[0].ok());
}

TEST(ProcessLauncherTest, DeadlineStopsEveryRank) {
  StopEvent seen;
  ProcessLauncher launcher({.deadline = 300ms, .kill_grace = 1000ms, .forward_signals = false});
  launcher.set_on_stop([&](const StopEvent& e, const WorldExit&) { seen = e; });
  const auto t0 = std::chrono::steady_clock::now();
  const WorldExit world = launcher.Run({Sh("sleep 30"), Sh("sleep 30")});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(world.stop_reason, StopReason::kDeadline);
  EXPECT_EQ(seen.reason, StopReason::kDeadline);
  EXPECT_EQ(world.first_failed, -1);
  for (const auto& r : world.ranks) {
    EXPECT_TRUE(r.stopped);
    EXPECT_FALSE(r.ok());
  }
}

TEST(ProcessLauncherTest, SpawnErrorIsTheFirstFailure) {
  ProcessLauncher launcher({.kill_grace = 1000ms, .forward_signals = false});
  RankCommand missing;
  missing.argv = {"/nonexistent/fsdp-program"};
  const WorldExit world = launcher.Run({Sh("sleep 30"), missing});
  EXPECT_EQ(world.first_failed, 1);
  EXPECT_EQ(world.ranks[1].exit_code(), 127);
  EXPECT_NE(world.ranks[1].Describe().find("cannot start /nonexistent/fsdp-program"),
            std::string::npos);
  EXPECT_TRUE(world.ranks[0].stopped);
}

TEST(ProcessLauncherTest, ReceivedSignalIsForwardedToTheRanks) {
  ProcessLauncher launcher({.kill_grace = 2000ms});
  // Rank 0 signals the launcher (its parent); every rank then receives SIGTERM.
  const WorldExit world = launcher.Run({Sh("kill -TERM $PPID; sleep 30"), Sh("sleep 30")});
  EXPECT_EQ(world.stop_reason, StopReason::kSignal);
  EXPECT_EQ(world.received_signal, SIGTERM);
  for (const auto& r : world.ranks) EXPECT_EQ(r.exit_code(), 128 + SIGTERM);
}

TEST(ProcessLauncherTest, StdinFdFeedsTheRank) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  FILE* out = std::tmpfile();
  RankCommand c = Sh("read line; echo \"got $line\"");
  c.stdin_fd = p[0];
  c.out = OutputSink::Inherit(fileno(out));
  ASSERT_EQ(::write(p[1], "case-1\n", 7), 7);
  ::close(p[1]);
  const WorldExit world = ProcessLauncher({.forward_signals = false}).Run({c});
  ::close(p[0]);
  const std::string text = ReadAll(out);
  std::fclose(out);
  EXPECT_TRUE(world.ok());
  EXPECT_EQ(text, "got case-1\n");
}

TEST(ProcessLauncherTest, StopRequestedStopsEveryRank) {
  std::atomic<bool> stop{false};
  StopEvent seen;
  ProcessLauncher launcher({.kill_grace = 1000ms, .forward_signals = false,
                            .stop_requested = [&] { return stop.load(); }});
  launcher.set_on_stop([&](const StopEvent& e, const WorldExit&) { seen = e; });
  std::thread requester([&] {
    std::this_thread::sleep_for(200ms);
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  const WorldExit world = launcher.Run({Sh("sleep 30"), Sh("sleep 30")});
  requester.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(world.stop_reason, StopReason::kRequested);
  EXPECT_EQ(seen.reason, StopReason::kRequested);
  EXPECT_EQ(world.first_failed, -1);
  for (const auto& r : world.ranks) {
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.exit_code(), 128 + SIGTERM);
  }
}

TEST(ProcessLauncherTest, EmptyCommandsAreRejected) {
  EXPECT_ANY_THROW(ProcessLauncher().Run({}));
  EXPECT_ANY_THROW(ProcessLauncher().Run({RankCommand{}}));
}

}  // namespace
}  // namespace fsdp::distributed
