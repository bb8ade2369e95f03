#include "conformance/flight_recorder_file.h"

#include <pthread.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "engine/core/error.h"
#include "engine/serialization/atomic_file.h"

namespace fsdp::conformance {

namespace {
sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

FlightRecorderFile::FlightRecorderFile(std::shared_ptr<distributed::FlightRecorder> recorder,
                                       int rank, std::string path)
    : recorder_(std::move(recorder)), rank_(rank), path_(std::move(path)) {
  FSDP_CHECK(recorder_ != nullptr, "FlightRecorderFile: null recorder");
  const sigset_t stop = StopSignals();
  FSDP_CHECK(pthread_sigmask(SIG_BLOCK, &stop, &previous_mask_) == 0,
             "FlightRecorderFile: cannot block SIGTERM/SIGINT");
  waiter_ = std::thread([this] { WaitForSignals(); });
}

FlightRecorderFile::~FlightRecorderFile() {
  Write("the rank function ended");
  stop_ = true;
  waiter_.join();
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

std::string FlightRecorderFile::PathFor(const std::string& run_dir, int rank) {
  return run_dir + "/rank" + std::to_string(rank) + ".flight_recorder.txt";
}

void FlightRecorderFile::Write(const std::string& why) noexcept {
  try {
    std::ostringstream os;
    os << "rank " << rank_ << " flight recorder (" << why << "): the last "
       << distributed::FlightRecorder::kDefaultCapacity << " of "
       << recorder_->issued_count() << " collectives issued, oldest first\n"
       << recorder_->Dump(distributed::FlightRecorder::kDefaultCapacity) << "\n";
    serialization::WriteFileAtomically(path_, os.str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cannot write the flight recorder to %s: %s\n", path_.c_str(), e.what());
  }
}

void FlightRecorderFile::WaitForSignals() {
  const sigset_t stop = StopSignals();
  const timespec poll{0, 100 * 1000 * 1000};  // 100 ms: how soon the destructor's join returns
  while (!stop_) {
    const int sig = sigtimedwait(&stop, nullptr, &poll);
    if (sig < 0) continue;  // EAGAIN (the poll passed) or EINTR
    Write(sig == SIGTERM ? "stopped by SIGTERM" : "stopped by SIGINT");
    // End the process by the signal, as it would have ended without the file.
    signal(sig, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
    raise(sig);
    return;
  }
}

}  // namespace fsdp::conformance
