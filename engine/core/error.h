// Error reporting for the whole project: fsdp::Error with an ErrorCode, thrown through
// FSDP_CHECK / FSDP_THROW like LibTorch's TORCH_CHECK. Messages must name the unit, the FQN,
// shapes, world size and state that were wrong. Nothing inside the engine catches and carries
// on; rank runners and the conformance subject boundary turn exceptions into per-rank results.
// Thread-safety: stateless.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace fsdp {

enum class ErrorCode {
  kInvalidArgument,     // the caller passed something wrong (shape, dtype, option, FQN)
  kFailedPrecondition,  // the call is wrong in the current state (TrainingState, ShardedState)
  kDeadlineExceeded,    // a blocking wait ran past its deadline
  kDataLoss,            // corrupt or truncated data (files, mismatched collective payloads)
  kUnavailable,         // a peer, device or backend is not there (no GPU, rank missing)
  kNotFound,            // a named thing does not exist (scenario, key, module)
  kAborted,             // the operation was aborted because another rank failed
  kResourceExhausted,   // out of (device) memory after releasing every cached block
  kInternal,            // an invariant of ours is broken
};

const char* ErrorCodeName(ErrorCode code);

// The one exception type of the project. what() is "<CodeName>: <message>".
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message);
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

namespace detail {
template <typename... Args>
std::string StrCat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace fsdp

// Throws fsdp::Error(code, message) where message is the streamed concatenation of the args.
#define FSDP_THROW(code, ...) \
  throw ::fsdp::Error((code), ::fsdp::detail::StrCat(__VA_ARGS__))

// Checks an argument-level condition (InvalidArgument).
#define FSDP_CHECK(cond, ...)                                                       \
  do {                                                                              \
    if (!(cond)) FSDP_THROW(::fsdp::ErrorCode::kInvalidArgument, __VA_ARGS__);      \
  } while (0)

// Checks a condition with an explicit error code, e.g. kFailedPrecondition for state errors.
#define FSDP_CHECK_CODE(code, cond, ...)               \
  do {                                                 \
    if (!(cond)) FSDP_THROW((code), __VA_ARGS__);      \
  } while (0)

// Internal invariant: a broken one is our bug, reported with the failed expression.
#define FSDP_INTERNAL_ASSERT(cond, ...)                                                   \
  do {                                                                                    \
    if (!(cond))                                                                          \
      FSDP_THROW(::fsdp::ErrorCode::kInternal, "internal assertion failed: " #cond " at ", \
                 __FILE__, ":", __LINE__, " ", ##__VA_ARGS__);                            \
  } while (0)
