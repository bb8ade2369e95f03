// DriverSession: one driver's long-lived rank processes serving many cases (the driver
// protocol's session mode; docs/scenarios.md, "Driver sessions"). Protocol 2 starts one
// process per rank per case; a driver that declares sessions (`DRIVER --capabilities` prints
// {"protocol": 2, "session": true}; session_launcher.h probes it) is instead started once per
// backend as `DRIVER --serve`, N processes (N at least the world of every case it serves), and
// each case of world W is handed to ranks 0..W-1 as one line on their stdin: the JSON array of
// the case's flags (DriverRequest::ToArgs(), exactly the argv of a one-shot rank). The rank
// runs the case, writes its result (and tensors) file as in protocol 2 — the result file last
// and whole (written elsewhere, then renamed), since its appearance is what says the rank is
// done — and reads the next line. End of file on stdin asks it to exit with status 0. The stdin is
// one end of a Unix socket pair; the runner holds the other, so a rank's exit (any status, at any
// time) is seen at once as a hang-up.
//
// Each case gets a fresh run directory (WriteCaseRequests: its own empty store/ for a fresh
// rendezvous, the requests, the inputs), removed when every rank succeeded and kept (named in
// the errors) otherwise. The ranks' stdout and stderr go to `rankR.log` in the session's own
// directory for the whole session (the errors quote its tail).
//
// Spawning, process groups, the death watch (no rank outlives the runner, however it dies)
// and signal forwarding are distributed::ProcessLauncher's: Run() runs the session's world on
// a thread of its own, with no deadline and no failure grace (a rank that exits during the
// session, on its own, ends it: the others are stopped at once), and stops it when asked. The
// session serves a case until every rank wrote its result, or until: the case's deadline
// (the ranks are killed: DeadlineExceeded), the failure grace after a rank's error result
// (the others are killed: Aborted), or a rank's death (that rank: Internal, naming its exit
// and the case; the others: Aborted). After any of these, any error result, or a result that
// asks to end the session ("end_session": the rank could not return to a clean state, e.g. its
// teardown did not finish; the case keeps its verdict), the session is over (healthy() false)
// and the launcher starts a fresh one for the next case.
//
// Ownership: owns the rank processes (through its thread), their stdin pipes and the session
// directory (removed at Close() unless a case failed in it). Thread-safety: one owner thread;
// Serve() one case at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "conformance/driver_protocol.h"
#include "conformance/launcher.h"
#include "engine/distributed/launch/process_launcher.h"

namespace fsdp::conformance {

inline constexpr const char* kServeFlag = "--serve";

class DriverSession {
 public:
  // Starts `size` processes `command... --serve` (the program is a path). A rank that cannot
  // be started ends the session at once; the first Serve() reports it.
  DriverSession(std::vector<std::string> command, int size, std::string backend);
  ~DriverSession();  // Close()
  DriverSession(const DriverSession&) = delete;
  DriverSession& operator=(const DriverSession&) = delete;

  int size() const { return size_; }
  const std::string& backend() const { return backend_; }
  // Every rank is running and no case has failed in this session: it may serve the next case.
  bool healthy() const { return healthy_ && !ended_.load(); }
  // The signal (SIGINT, SIGTERM) the runner received and forwarded to the ranks while this
  // session ran; 0 when none.
  int received_signal() const { return received_signal_; }

  // Hands the case `request` (request.world <= size()) to ranks 0..world-1 (its files written
  // to `run_dir`, an existing directory) and waits for their results; exactly request.world
  // outcomes, element r for rank r. Never throws for a rank's failure. The other ranks idle.
  std::vector<RankOutcome> Serve(const LaunchRequest& request, const std::string& run_dir);

  // Ends the session: end of file on every rank's stdin, up to the kill grace for them to exit,
  // then SIGTERM and SIGKILL to the stragglers. Idempotent.
  void Close();

 private:
  // Stops the ranks (SIGTERM, then SIGKILL) and waits for the session's thread.
  void Stop();
  std::string LogPath(int rank) const;

  std::vector<std::string> command_;
  int size_;                       // rank processes
  std::string backend_;
  std::string dir_;                // the session's directory (rankR.log)
  std::vector<int> control_;       // per rank: the runner's end of its stdin socket (-1: closed)
  std::vector<int> rank_ends_;     // per rank: the rank's end, closed once it was started
  std::atomic<bool> stop_{false};  // asks the session's ProcessLauncher to stop the ranks
  std::atomic<bool> started_{false};  // every rank has been started (or the session ended)
  std::atomic<bool> ended_{false}; // the session's ProcessLauncher returned
  distributed::WorldExit exit_;    // how the ranks ended; valid once ended_ (and joined)
  std::thread thread_;
  bool healthy_ = true;
  bool keep_dir_ = false;
  int received_signal_ = 0;
};

}  // namespace fsdp::conformance
