// FlightRecorderFile: a worker rank's flight recorder (distributed::FlightRecorder: its last
// collectives with id, op, group, sizes, dtype and state) written to its case's run directory
// as "rank<r>.flight_recorder.txt", so that whoever debugs a failed or hung case finds what
// every rank last issued. Written when the worker's rank function ends (whatever the outcome)
// and when the worker is stopped by SIGTERM or SIGINT (the runner's deadline or failure grace,
// an interrupted run): the constructor blocks those signals in the calling thread, so in every
// thread the worker starts afterwards (Gloo's included), and a thread of its own waits for
// them, writes the file and then ends the process by the same signal, as it would have ended
// without the file. The runner names the file in a failed rank's report.
//
// Ownership: shares the recorder; owns the signal thread (joined by the destructor, which
// restores the calling thread's signal mask).
// Thread-safety: Write() may be called from any thread (the recorder is synchronised).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <signal.h>

#include "engine/distributed/flight_recorder.h"

namespace fsdp::conformance {

class FlightRecorderFile {
 public:
  FlightRecorderFile(std::shared_ptr<distributed::FlightRecorder> recorder, int rank,
                     std::string path);
  // Writes the file ("the rank function ended") and stops the signal thread.
  ~FlightRecorderFile();
  FlightRecorderFile(const FlightRecorderFile&) = delete;
  FlightRecorderFile& operator=(const FlightRecorderFile&) = delete;

  // Writes the file now (replacing an earlier one); `why` heads it ("ended", "SIGTERM").
  // Never throws: a write that fails is reported on stderr only.
  void Write(const std::string& why) noexcept;

  // "<run_dir>/rank<r>.flight_recorder.txt".
  static std::string PathFor(const std::string& run_dir, int rank);

 private:
  void WaitForSignals();

  std::shared_ptr<distributed::FlightRecorder> recorder_;
  int rank_;
  std::string path_;
  sigset_t previous_mask_;
  std::atomic<bool> stop_{false};
  std::thread waiter_;
};

}  // namespace fsdp::conformance
