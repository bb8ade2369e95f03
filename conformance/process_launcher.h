// ProcessLauncher: runs a case's ranks as child processes under the driver protocol
// (driver_protocol.h). For every case it makes a fresh run directory (mkdtemp) holding an
// empty `store/` directory for rendezvous and, per rank, `rankR.request.json`,
// `rankR.result.json` and `rankR.log` (the child's stdout and stderr). Spawning and waiting
// are distributed::ProcessLauncher's (engine/distributed/launch/process_launcher.h): each
// child runs in its own process group; the case's deadline, and once a rank failed the
// failure grace, stop stragglers (SIGTERM, then SIGKILL to their process group); a SIGINT or
// SIGTERM received meanwhile is forwarded to the ranks and, once they are stopped, re-raised.
// This class maps the exits to outcomes: it reads the result files. The run directory is
// removed when every rank succeeded and kept (its path named in the errors) otherwise.
//
// The same launcher serves the process backends (command = this binary + `__worker
// --subject NAME`) and third-party drivers (command = the driver program).
//
// Ownership: holds the command. Thread-safety: one Launch at a time.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "conformance/launcher.h"

namespace fsdp::conformance {

class ProcessLauncher final : public RankLauncher {
 public:
  // `command`: the program (a path) and its leading arguments; the protocol flags follow.
  // `subject`: passed as --subject (for `__worker`); empty for external drivers.
  explicit ProcessLauncher(std::vector<std::string> command, std::string subject = "");

  std::vector<RankOutcome> Launch(const LaunchRequest& request) override;

 private:
  std::vector<std::string> command_;
  std::string subject_;
};

// The path of the running executable (/proc/self/exe), for re-executing it as a worker.
std::string SelfExecutable();

// "1.5 s": a duration for messages (three significant digits).
std::string FormatSeconds(std::chrono::milliseconds ms);

// A fresh run directory $TMPDIR/fsdp-conform.XXXXXX (mkdtemp, 0700); Unavailable when it
// cannot be made. Shared with the driver sessions (driver_session.h).
std::string MakeRunDir();

// The last `max_lines` lines of a log file (at most 4 KiB of it), each on a new line indented
// with "    | "; "" when the file is empty or absent.
std::string LogTail(const std::string& path, int max_lines = 15);

}  // namespace fsdp::conformance
