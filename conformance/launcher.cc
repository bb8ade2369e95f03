#include "conformance/launcher.h"

#include <algorithm>

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

std::chrono::milliseconds StragglerTimeoutOf(std::chrono::milliseconds case_timeout) {
  const std::chrono::milliseconds derived =
      std::clamp(case_timeout / 100, std::chrono::milliseconds(2000),
                 std::chrono::milliseconds(10000));
  return std::max(std::min(derived, case_timeout / 2), std::chrono::milliseconds(1));
}

}  // namespace fsdp::conformance
