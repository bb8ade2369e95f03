// ProcessLauncher: starts a world's ranks as child processes and sees them to the end. The one
// implementation of spawning, waiting with a deadline, teardown and exit collection shared by
// fsdp-launch / pg-bench's self-launch (tools/launch/local_launcher.h) and the conformance
// runner's process backends and drivers (conformance/process_launcher.h); callers keep their
// own policy (launch variables, run directories, how outcomes are reported).
//
// Every rank runs in its own process group (a rank's own children are stopped with it), with
// SIGINT, SIGTERM and SIGPIPE at their default dispositions, and the launcher's environment
// plus the rank's extra variables; its stdin is /dev/null, the launcher's, or a given
// descriptor. Its stdout and stderr each go to one of: the launcher's
// descriptor (inherited, or a given one), a file (created or truncated; stderr may share
// stdout's file), or a pipe whose output is written line by line, each line prefixed, to a
// given descriptor. Run() waits for every rank. The first rank that fails on its own (spawn
// error, non-zero exit, killed by a signal) is the world's first failure; the other ranks get
// `failure_grace`, then they are stopped: SIGTERM to their process groups, SIGKILL after
// `kill_grace`. A run past `deadline`, or one whose `stop_requested` says so, is stopped the
// same way. With `forward_signals`, a
// SIGINT or SIGTERM received by the launcher while it runs is sent on to every rank (SIGKILL
// after `kill_grace`) and reported; SIGPIPE is then ignored (output to a closed reader is
// dropped). Run() returns every rank's exit: its wait status, or its spawn error, and whether
// the launcher stopped it. If the launcher itself dies while ranks run (any way, SIGKILL
// included), a LauncherDeathWatch stops their process groups (SIGTERM, SIGKILL after
// `kill_grace`), so no rank outlives it.
//
//   ProcessLauncher launcher({.deadline = 60s, .failure_grace = 5s});
//   WorldExit exit = launcher.Run({RankCommand{.argv = {"prog"}, .env = {{"RANK", "0"}}}, ...});
//   if (!exit.ok()) ... exit.first_failed, exit.ranks[r].Describe() ...
//
// Ownership: value types; Run() owns its children for the call (none outlives it).
// Thread-safety: with forward_signals, Run() installs process-wide SIGINT/SIGTERM/SIGPIPE
// dispositions for its duration; run one at a time per process. Without, Run() touches no
// process-wide state besides reaping its own children.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::distributed {

// Where one output stream (stdout or stderr) of a rank goes.
struct OutputSink {
  enum class Kind {
    kInherit,       // descriptor `fd` (-1: the launcher's own stdout/stderr)
    kFile,          // the file `path`, created or truncated
    kPrefixLines,   // a pipe: every line written to `fd` (-1: the launcher's own) after `prefix`
    kSameAsStdout,  // stderr only: wherever stdout goes (2>&1)
  };
  Kind kind = Kind::kInherit;  // Default: inherit
  int fd = -1;                 // kInherit, kPrefixLines. Default: -1
  std::string path;            // kFile
  std::string prefix;          // kPrefixLines

  static OutputSink Inherit(int fd = -1) { return {Kind::kInherit, fd, "", ""}; }
  static OutputSink File(std::string path) { return {Kind::kFile, -1, std::move(path), ""}; }
  static OutputSink PrefixLines(std::string prefix, int fd = -1) {
    return {Kind::kPrefixLines, fd, "", std::move(prefix)};
  }
  static OutputSink SameAsStdout() { return {Kind::kSameAsStdout, -1, "", ""}; }
};

// One rank's process.
struct RankCommand {
  std::vector<std::string> argv;  // required: the program and its arguments
  bool search_path = true;        // look the program up in PATH (posix_spawnp). Default: true
  // Variables added to (or replacing those of) the launcher's environment.
  std::vector<std::pair<std::string, std::string>> env;
  OutputSink out;                // Default: inherited
  OutputSink err;                // Default: inherited
  bool inherit_stdin = false;    // Default: false (stdin is /dev/null)
  // A descriptor that becomes the rank's stdin (e.g. the read end of a pipe the caller writes
  // requests into); it replaces inherit_stdin. The caller keeps and closes it. Default: -1.
  int stdin_fd = -1;
};

// Why the launcher stopped the ranks still running.
enum class StopReason { kNone, kRankFailed, kDeadline, kSignal, kRequested };

struct LaunchPolicy {
  // Deadline of the whole run, from the first spawn; zero means none. Default: none.
  std::chrono::milliseconds deadline{0};
  // After the first failure, how long the others may still finish on their own. Default: 0.
  std::chrono::milliseconds failure_grace{0};
  // Between SIGTERM and SIGKILL when stopping ranks. Default: 5 s.
  std::chrono::milliseconds kill_grace{5000};
  // Forward SIGINT/SIGTERM received during Run() to the ranks (and ignore SIGPIPE).
  // Default: true.
  bool forward_signals = true;
  // Polled by Run() while ranks run (every few milliseconds, on Run()'s thread; must be
  // thread-safe; first called once every rank has been started): once it returns true the running ranks are stopped as for a deadline
  // (StopReason::kRequested). Lets another thread end a world of long-lived ranks (a driver
  // session, conformance/driver_session.h). Default: none.
  std::function<bool()> stop_requested;
};

// How one rank ended.
struct RankExit {
  pid_t pid = -1;              // -1 when it could not be started
  std::string spawn_error;     // non-empty when it could not be started ("cannot start P: ...")
  int wait_status = 0;         // waitpid's status (127 << 8 after a spawn error)
  bool stopped = false;        // the launcher signalled it (teardown, deadline, forwarding)
  double seconds = 0;          // from its spawn to its exit

  bool ok() const;             // started and exited with status 0
  // The shell's view: the exit status, 128 + N when killed by signal N, 127 on a spawn error.
  int exit_code() const;
  // "exited with status 3", "was killed by signal 15 (Terminated)", or the spawn error.
  std::string Describe() const;
};

// How the world ended.
struct WorldExit {
  std::vector<RankExit> ranks;  // in the order of the commands
  int first_failed = -1;        // the first rank that failed on its own; -1 when none
  StopReason stop_reason = StopReason::kNone;
  int received_signal = 0;      // the signal forwarded (StopReason::kSignal); 0 when none

  bool ok() const;  // every rank exited with status 0 and nothing was stopped
};

// What Run() reports while it runs, for launchers that narrate (fsdp-launch): `rank` is the
// index of the rank concerned (-1 for a deadline or a signal).
struct StopEvent {
  StopReason reason = StopReason::kNone;
  int rank = -1;
  int signal = 0;              // kSignal: the signal received
  bool others_running = false; // whether any other rank was still running
};

class ProcessLauncher {
 public:
  explicit ProcessLauncher(LaunchPolicy policy = {});

  // Called once, at the first of: a rank's failure (before its failure_grace elapses), the
  // deadline, a received signal; with the exits known so far. Default: none.
  void set_on_stop(std::function<void(const StopEvent&, const WorldExit&)> on_stop) {
    on_stop_ = std::move(on_stop);
  }

  // Starts every command and waits until each has ended; never throws for a rank's failure
  // (a rank that cannot be started, or whose pipes cannot be made, reports a spawn error).
  // InvalidArgument on an empty command list or argv.
  WorldExit Run(const std::vector<RankCommand>& commands) const;

 private:
  LaunchPolicy policy_;
  std::function<void(const StopEvent&, const WorldExit&)> on_stop_;
};

}  // namespace fsdp::distributed
