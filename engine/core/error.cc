#include "engine/core/error.h"

namespace fsdp {

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kFailedPrecondition: return "FailedPrecondition";
    case ErrorCode::kDeadlineExceeded: return "DeadlineExceeded";
    case ErrorCode::kDataLoss: return "DataLoss";
    case ErrorCode::kUnavailable: return "Unavailable";
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kAborted: return "Aborted";
    case ErrorCode::kResourceExhausted: return "ResourceExhausted";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Error::Error(ErrorCode code, std::string message)
    : std::runtime_error(std::string(ErrorCodeName(code)) + ": " + message),
      code_(code),
      message_(std::move(message)) {}

}  // namespace fsdp
