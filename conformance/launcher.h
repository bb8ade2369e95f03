// RankLauncher: runs one case of a scenario on `world` ranks and returns each rank's outcome
// (its observations, an error, or a skip). Implementations: ThreadedLauncher (ranks as
// threads, threaded_launcher.h) and ProcessLauncher (ranks as processes under the driver
// protocol, process_launcher.h). The runner picks one by the backend's LaunchMode, or the
// ProcessLauncher with an external driver for `--subject external`.
//
// Launchers never judge, and never let a rank's exception escape: every failure becomes that
// rank's outcome. Every wait has a deadline; a rank still running past it is reported as
// DeadlineExceeded, and once a rank has failed the others get a short grace period before
// they are stopped and reported as Aborted.
//
// Thread-safety: a launcher runs one case at a time.
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/case_inputs.h"
#include "conformance/params.h"
#include "conformance/scenario.h"
#include "engine/core/error.h"

namespace fsdp::conformance {

struct RankOutcome {
  enum class Status { kOk, kError, kSkipped };
  Status status = Status::kError;
  nlohmann::json observations;            // kOk: the rank's observations
  ErrorCode code = ErrorCode::kInternal;  // kError
  std::string message;                    // kError: the error; kSkipped: the reason
  double seconds = 0;                     // wall time of the rank
  // Non-empty when the rank asked its driver session to end after this case (the result's
  // "end_session": its process could not return to a clean state, e.g. a teardown that did not
  // finish); the case's verdict does not change, the next case starts a fresh session.
  std::string end_session;

  static RankOutcome Ok(nlohmann::json observations, double seconds);
  static RankOutcome Failed(ErrorCode code, std::string message, double seconds);
  static RankOutcome Skipped(std::string reason, double seconds);
  // "rank 2: DeadlineExceeded: ..." style one-liner for reports.
  std::string Describe(int rank) const;
};

struct LaunchRequest {
  const Scenario* scenario = nullptr;  // required; outlives the launch
  CaseParams params;                   // the case
  // The case's inputs (Scenario::inputs), made once by the runner; null when it has none.
  std::shared_ptr<const CaseInputs> inputs;
  int world = 1;
  std::string backend;                        // backend name passed to ranks
  std::chrono::milliseconds timeout{300000};  // Default: 300 s for the whole case
  // After the first failing rank, the others get this long to finish on their own (a peer
  // blocked in a collective with the failed rank would otherwise wait for the deadline).
  std::chrono::milliseconds failure_grace{5000};  // Default: 5 s
  // Process ranks cross-check every collective's fingerprint before it runs
  // (FSDP_CHECK_COLLECTIVES=1 in their environment). Default: true.
  bool check_collectives = true;
};

// The straggler timeout the runner gives a case's process ranks (FSDP_STRAGGLER_TIMEOUT_MS):
// 1% of the case's timeout, at least 2 s and at most 10 s, times ceil(world / (2 x cores)) for
// a world that oversubscribes the machine's cores (its ranks progress in turns) up to a quarter
// of the timeout, and never more than half the timeout, so that a missing or hung rank is named
// long before the case's deadline and a rank that only waits for a core is not. The two-argument
// form counts the cores of this machine.
std::chrono::milliseconds StragglerTimeoutOf(std::chrono::milliseconds case_timeout, int world,
                                             int cores);
std::chrono::milliseconds StragglerTimeoutOf(std::chrono::milliseconds case_timeout, int world);

class RankLauncher {
 public:
  virtual ~RankLauncher() = default;
  // Returns exactly request.world outcomes, element r for rank r.
  virtual std::vector<RankOutcome> Launch(const LaunchRequest& request) = 0;
};

}  // namespace fsdp::conformance
