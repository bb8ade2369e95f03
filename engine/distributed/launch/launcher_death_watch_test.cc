// LauncherDeathWatch: a launcher killed with SIGKILL while its ranks run leaves no rank (nor a
// rank's own child) behind; a released watch signals nothing.
#include "engine/distributed/launch/launcher_death_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/distributed/launch/process_launcher.h"

namespace fsdp::distributed {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<pid_t> ReadPids(const std::string& path) {
  std::vector<pid_t> pids;
  std::ifstream in(path);
  for (long pid; in >> pid;) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

RankCommand Sh(const std::string& script) {
  RankCommand c;
  c.argv = {"sh", "-c", script};
  return c;
}

TEST(LauncherDeathWatchTest, ASigkilledLauncherLeavesNoRankBehind) {
  // Orphans are re-parented to this test process, so it can reap them and see them end.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string pid_file = (std::filesystem::temp_directory_path() /
                                ("death_watch_" + std::to_string(::getpid()) + ".pids"))
                                   .string();
  std::filesystem::remove(pid_file);
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    ProcessLauncher world({.kill_grace = 1000ms, .forward_signals = false});
    // Rank 0 has a child of its own (same process group); rank 1 is a single process.
    world.Run({Sh("sleep 60 & echo $! >> " + pid_file + "; echo $$ >> " + pid_file + "; wait"),
               Sh("echo $$ >> " + pid_file + "; exec sleep 60")});
    ::_exit(0);
  }
  const auto started = Clock::now();
  while (ReadPids(pid_file).size() < 3 && Clock::now() - started < 20s) {
    std::this_thread::sleep_for(10ms);
  }
  const std::vector<pid_t> pids = ReadPids(pid_file);
  ASSERT_EQ(pids.size(), 3u) << "the ranks did not start";
  // A rank writes its pid as soon as it runs, possibly before the launcher has handed it to its
  // death watch (a launcher killed in that window, during its start-up, can leave it behind);
  // on a loaded machine that window can last a while, so let the launcher finish starting.
  std::this_thread::sleep_for(500ms);

  ASSERT_EQ(::kill(launcher, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  const auto killed_at = Clock::now();

  std::vector<bool> ended(pids.size(), false);
  size_t left = pids.size();
  while (left > 0 && Clock::now() - killed_at < 5s) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (ended[i]) continue;
      // ECHILD until the orphan is re-parented here; then it is reaped once it ended.
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        ended[i] = true;
        --left;
      }
    }
    std::this_thread::sleep_for(10ms);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  for (size_t i = 0; i < pids.size(); ++i) {
    EXPECT_TRUE(ended[i]) << "process " << pids[i] << " outlived its killed launcher";
    if (!ended[i]) ::kill(pids[i], SIGKILL);
  }
  EXPECT_LT(seconds, 2.0) << "the ranks were stopped " << seconds << " s after the launcher died";
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  std::filesystem::remove(pid_file);
}

TEST(LauncherDeathWatchTest, AReleasedWatchSignalsNothing) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setpgid(0, 0);
    ::execlp("sleep", "sleep", "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(child, child);
  {
    LauncherDeathWatch watch(100ms);
    ASSERT_TRUE(watch.active());
    watch.Watch(child);
    watch.Release();
    EXPECT_FALSE(watch.active());
  }
  std::this_thread::sleep_for(300ms);  // longer than the watch's kill grace
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, WNOHANG), 0) << "the released watch stopped the process";
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
}

}  // namespace
}  // namespace fsdp::distributed
