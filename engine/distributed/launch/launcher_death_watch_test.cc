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

// Waits up to 20 s for `count` pids in `pid_file`.
std::vector<pid_t> AwaitPids(const std::string& pid_file, size_t count) {
  const auto started = Clock::now();
  while (ReadPids(pid_file).size() < count && Clock::now() - started < 20s) {
    std::this_thread::sleep_for(10ms);
  }
  return ReadPids(pid_file);
}

// Once `count` pids are in `pid_file` (the ranks run), SIGKILLs `launcher` and requires every
// one of them (orphans re-parented to this process, a child subreaper) to end within 2 s; then
// ends the subreaper role and removes `pid_file`.
void ExpectKillingTheLauncherEnds(pid_t launcher, const std::string& pid_file, size_t count) {
  const std::vector<pid_t> pids = AwaitPids(pid_file, count);
  ASSERT_EQ(pids.size(), count) << "the ranks did not start";
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

std::string PidFile(const std::string& name) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".pids"))
          .string();
  std::filesystem::remove(path);
  return path;
}

TEST(LauncherDeathWatchTest, ASigkilledLauncherLeavesNoRankBehind) {
  // Orphans are re-parented to this test process, so it can reap them and see them end.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string pid_file = PidFile("death_watch");
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    ProcessLauncher world({.kill_grace = 1000ms, .forward_signals = false});
    // Rank 0 has a child of its own (same process group); rank 1 is a single process.
    world.Run({Sh("sleep 60 & echo $! >> " + pid_file + "; echo $$ >> " + pid_file + "; wait"),
               Sh("echo $$ >> " + pid_file + "; exec sleep 60")});
    ::_exit(0);
  }
  // Killed as soon as every rank runs: a rank may not have been handed to Watch() yet (the
  // launcher's start-up window); its environment entry names it to the watch all the same.
  ExpectKillingTheLauncherEnds(launcher, pid_file, 3);
}

TEST(LauncherDeathWatchTest, ARankNotYetWatchedIsStoppedThroughItsEnvironmentEntry) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string pid_file = PidFile("death_watch_entry");
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    // A launcher that dies between starting its rank and Watch(): the rank (which also starts
    // a child in a session of its own, outside its process group) carries only the entry.
    LauncherDeathWatch watch(1000ms);
    if (!watch.active()) ::_exit(3);
    const std::string entry =
        std::string(LauncherDeathWatch::kEnvironmentVariable) + "=" + watch.environment_value();
    const std::string script =
        "setsid sleep 60 & echo $! >> " + pid_file + "; echo $$ >> " + pid_file + "; wait";
    const pid_t rank = ::fork();
    if (rank == 0) {
      ::setpgid(0, 0);
      char* env[] = {const_cast<char*>(entry.c_str()), const_cast<char*>("PATH=/usr/bin:/bin"),
                     nullptr};
      char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                      const_cast<char*>(script.c_str()), nullptr};
      ::execve("/bin/sh", argv, env);
      ::_exit(127);
    }
    for (;;) ::pause();
  }
  ExpectKillingTheLauncherEnds(launcher, pid_file, 2);
}

TEST(LauncherDeathWatchTest, TheEnvironmentEntryIsUniqueToItsWatch) {
  LauncherDeathWatch a(100ms);
  LauncherDeathWatch b(100ms);
  ASSERT_TRUE(a.active());
  ASSERT_TRUE(b.active());
  EXPECT_FALSE(a.environment_value().empty());
  EXPECT_NE(a.environment_value(), b.environment_value());
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
