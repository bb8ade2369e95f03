#include "conformance/launcher.h"

#include <algorithm>
#include <thread>

namespace fsdp::conformance {

RankOutcome RankOutcome::Ok(nlohmann::json observations, double seconds) {
  RankOutcome o;
  o.status = Status::kOk;
  o.observations = std::move(observations);
  o.seconds = seconds;
  return o;
}

RankOutcome RankOutcome::Failed(ErrorCode code, std::string message, double seconds) {
  RankOutcome o;
  o.status = Status::kError;
  o.code = code;
  o.message = std::move(message);
  o.seconds = seconds;
  return o;
}

RankOutcome RankOutcome::Skipped(std::string reason, double seconds) {
  RankOutcome o;
  o.status = Status::kSkipped;
  o.message = std::move(reason);
  o.seconds = seconds;
  return o;
}

std::string RankOutcome::Describe(int rank) const {
  const std::string who = "rank " + std::to_string(rank) + ": ";
  switch (status) {
    case Status::kOk:
      return who + "ok";
    case Status::kSkipped:
      return who + "skipped: " + message;
    case Status::kError:
      return who + ErrorCodeName(code) + ": " + message;
  }
  return who;
}

}  // namespace fsdp::conformance

namespace fsdp::conformance {

std::chrono::milliseconds StragglerTimeoutOf(std::chrono::milliseconds case_timeout, int world,
                                             int cores) {
  using std::chrono::milliseconds;
  const milliseconds base = std::clamp(case_timeout / 100, milliseconds(2000), milliseconds(10000));
  // Ranks that share cores progress in turns: a peer of an oversubscribed world can be late, or
  // its heartbeat stale, for longer without being stuck.
  const int64_t two_per_core = 2 * std::max(cores, 1);
  const int64_t factor = std::max<int64_t>(1, (world + two_per_core - 1) / two_per_core);
  const milliseconds scaled = std::min(base * factor, std::max(base, case_timeout / 4));
  return std::max(std::min(scaled, case_timeout / 2), milliseconds(1));
}

std::chrono::milliseconds StragglerTimeoutOf(std::chrono::milliseconds case_timeout, int world) {
  const unsigned cores = std::thread::hardware_concurrency();
  return StragglerTimeoutOf(case_timeout, world, cores == 0 ? 1 : static_cast<int>(cores));
}

}  // namespace fsdp::conformance
