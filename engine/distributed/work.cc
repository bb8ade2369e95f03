#include "engine/distributed/work.h"

namespace fsdp::distributed {

void AsyncWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = cv_.wait_for(lock, timeout, [&] { return done_; });
  FSDP_CHECK_CODE(ErrorCode::kDeadlineExceeded, done, "Work::wait: ", description(),
                  " did not complete within ", timeout.count(), " ms");
  if (error_) throw *error_;
}

bool AsyncWork::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool AsyncWork::is_success() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && !error_;
}

void AsyncWork::MarkCompleted() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
  }
  cv_.notify_all();
}

void AsyncWork::MarkFailed(const Error& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

}  // namespace fsdp::distributed
