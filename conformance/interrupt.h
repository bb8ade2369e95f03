// RunInterrupt: how `fsdp-conform run` ends when it is interrupted (SIGINT, SIGTERM) instead of
// dying with its report unwritten.
//
// While a RunInterrupt is alive, the first SIGINT or SIGTERM is recorded (and one line is
// written to stderr); the run loop finishes the running case, runs no further case, writes the
// partial report marking the interruption, and then ends as the signal would have
// (EndAsSignalled: default disposition, re-raised, so the shell sees 128 + N). A second signal
// ends the process at once. Process backends stop their ranks promptly: the process launcher
// forwards the signal to the ranks while they run (its own handlers replace these for that
// time) and hands the signal on here with Note().
//
// Ownership: one instance per process at a time (the `run` command); the recorded signal is
// process-wide. Thread-safety: received() and Note() may be called from any thread; the
// handlers only store an atomic and write(2).
#pragma once

#include <memory>

namespace fsdp::conformance {

class RunInterrupt {
 public:
  RunInterrupt();   // installs the SIGINT/SIGTERM handlers
  ~RunInterrupt();  // restores the previous dispositions
  RunInterrupt(const RunInterrupt&) = delete;
  RunInterrupt& operator=(const RunInterrupt&) = delete;

  // The signal received since construction (the first one), or 0.
  static int received();
  // A launcher forwarded `signal` to its ranks: while a RunInterrupt is alive it is recorded
  // (the first one wins); otherwise the process ends as the signal would have.
  static void Note(int signal);
  // Restores the default disposition of received() and raises it. Returns only when no signal
  // was received.
  static void EndAsSignalled();

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

}  // namespace fsdp::conformance
