// LauncherDeathWatch: the guarantee that a launcher's ranks never outlive it, however it ends
// (SIGKILL and crashes included, which no handler of the launcher's own can see).
//
// The watch is a small process forked by the launcher before it starts the ranks, in its own
// process group (so a Ctrl-C or a kill of the launcher's group does not take it down first),
// ignoring SIGINT, SIGTERM and SIGHUP, holding only the read end of a pipe whose write end
// only the launcher holds (close-on-exec, so no rank inherits it). The launcher sends it each
// rank's process group as the rank starts (Watch()), and puts kEnvironmentVariable =
// environment_value() (unique to this watch) into every rank's environment. If the pipe reaches end
// of file without Release() — the launcher died — the watch sends SIGTERM to every group it was
// given and to every process whose environment holds its entry (found through /proc), SIGKILL to
// both after `kill_grace`, and exits. The entry closes the launcher's start-up window: a rank
// started but not yet handed to Watch() when the launcher dies carries it from its first
// instruction, as do a rank's descendants that left its process group. Release() (also the
// destructor) tells the watch the ranks were seen to the end; it exits without signalling anything
// and is reaped.
//
// Between fork and its exit the watch runs only async-signal-safe calls, so it may be forked
// from a multi-threaded process.
//
// Ownership: owns the watch process and the pipe's write end. Thread-safety: one owner thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace fsdp::distributed {

class LauncherDeathWatch {
 public:
  // Forks the watch. If it cannot be forked, the watch is inactive (active() false) and the
  // launcher runs without it.
  explicit LauncherDeathWatch(std::chrono::milliseconds kill_grace);
  ~LauncherDeathWatch();  // Release()
  LauncherDeathWatch(const LauncherDeathWatch&) = delete;
  LauncherDeathWatch& operator=(const LauncherDeathWatch&) = delete;

  bool active() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // Adds the process group `pgid` (a rank spawned as its group's leader) to the watch.
  void Watch(pid_t pgid);
  // The value of kEnvironmentVariable for every rank's environment: "<launcher pid>-<start
  // time in ns>" (empty when the watch is inactive). A process whose environment holds that
  // entry is stopped with the ranks when the launcher dies.
  const std::string& environment_value() const { return environment_value_; }
  static constexpr const char* kEnvironmentVariable = "FSDP_LAUNCHER_WATCH";
  // The ranks ended under the launcher's eye: the watch exits without signalling; reaps it.
  void Release();

 private:
  pid_t pid_ = -1;
  int write_fd_ = -1;
  std::string environment_value_;
};

}  // namespace fsdp::distributed
