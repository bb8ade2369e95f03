// SessionLauncher: the RankLauncher of an external driver that serves sessions
// (driver_session.h): the cases of a run go to one DriverSession at a time, of
// max(`ranks_hint`, the case's world) processes, kept while it is healthy and the cases fit
// (their world at most its size, the same backend), replaced otherwise (a larger world, a
// rank's death, a failed or timed-out case). The runner's hint is the largest world of the
// run's cases, so that one session serves them all and no case waits for interpreters to
// start. DriverServesSessions() is the capability
// probe that decides whether a driver gets this launcher or the one-shot ProcessLauncher
// (process_launcher.h): `DRIVER --capabilities`, with stdin /dev/null, must print one JSON
// object with "protocol": 2 and "session": true on stdout and exit 0 within the probe's time;
// anything else (a protocol-2 driver refuses the flag with exit 2) means one process per rank
// per case.
//
// Ownership: owns the current session; the destructor (or Close()) ends it.
// Thread-safety: one Launch at a time, on one thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "conformance/driver_session.h"
#include "conformance/launcher.h"

namespace fsdp::conformance {

inline constexpr const char* kCapabilitiesFlag = "--capabilities";

// Whether `command` (a program path and its leading arguments) declares driver sessions.
// `why` (optional) receives what the probe saw when the answer is no.
bool DriverServesSessions(const std::vector<std::string>& command,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60),
                          std::string* why = nullptr);

class SessionLauncher final : public RankLauncher {
 public:
  // `ranks_hint`: how many rank processes a session starts at least. Default: 1.
  explicit SessionLauncher(std::vector<std::string> command, int ranks_hint = 1);
  ~SessionLauncher() override { Close(); }

  std::vector<RankOutcome> Launch(const LaunchRequest& request) override;
  // Ends the current session, if any (its ranks exit).
  void Close();
  // Sessions started so far (a new world, or a replacement after a failure, starts one).
  int sessions_started() const { return sessions_started_; }

 private:
  std::vector<std::string> command_;
  int ranks_hint_;
  std::unique_ptr<DriverSession> session_;
  int sessions_started_ = 0;
};

}  // namespace fsdp::conformance
