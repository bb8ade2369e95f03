// Work: the handle of an issued collective (c10d's Work).
//
// wait() blocks until the collective is complete, then returns, or throws the collective's
// error; it throws Error(kDeadlineExceeded) naming the collective when it is not complete
// within the timeout (the group's timeout unless one is passed). wait() may be called more
// than once; a failed Work rethrows the same error each time.
//
// CompletedWork is returned by synchronous backends (the threaded fake and Gloo run the
// collective inside the issuing call, so async_op=true only changes when errors could be
// seen, never the result). AsyncWork is completed from another thread (MarkCompleted /
// MarkFailed) and is what an asynchronous backend or a FaultInjectingProcessGroup delay uses.
//
// Ownership: shared (std::shared_ptr) between the issuer and the backend.
// Thread-safety: AsyncWork is fully synchronised; CompletedWork is immutable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/core/error.h"

namespace fsdp::distributed {

class Work {
 public:
  // `description` names the collective in deadline errors ("allreduce_ #3 on group 0 ...").
  explicit Work(std::string description = "collective",
                std::chrono::milliseconds timeout = std::chrono::seconds(30))
      : description_(std::move(description)), timeout_(timeout) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Waits with the default timeout given at construction.
  void wait() { wait(timeout_); }
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  virtual bool is_completed() = 0;
  // True when completed without error.
  virtual bool is_success() = 0;

  const std::string& description() const { return description_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::string description_;
  std::chrono::milliseconds timeout_;
};

// A Work that completed successfully before it was returned.
class CompletedWork final : public Work {
 public:
  using Work::wait;
  using Work::Work;
  void wait(std::chrono::milliseconds /*timeout*/) override {}
  bool is_completed() override { return true; }
  bool is_success() override { return true; }
};

// A Work completed later, possibly from another thread.
class AsyncWork final : public Work {
 public:
  using Work::wait;
  using Work::Work;
  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;
  bool is_success() override;
  // Completes the work; waiters return. Only the first Mark* call has an effect.
  void MarkCompleted();
  // Fails the work; waiters throw `error`.
  void MarkFailed(const Error& error);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::optional<Error> error_;
};

}  // namespace fsdp::distributed
