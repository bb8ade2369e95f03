// CollectiveWatchdog: names a rank that hangs inside a collective every member reached, well
// before the collective's own deadline, for process groups whose ranks are processes (Gloo).
// The StragglerMonitor names ranks that never reach a collective; once every member has
// reached it, a rank that stops inside it (SIGSTOP, a debugger, a livelocked process) leaves
// its peers blocked on their transfers until the group's timeout, none of them able to say who
// is stuck. Modelled on ProcessGroupNCCL's watchdog and heartbeat monitor: a thread per group
//
//   - writes this rank's heartbeat, "<prefix>/heartbeat/<group rank>" = "<beat> <state>", every
//     heartbeat interval (a tenth of the straggler timeout, between 10 ms and 1 s), <state>
//     being the collective in flight or the last one completed;
//   - once this rank's collective has been in flight for half the straggler timeout, samples
//     the other members' heartbeats; when it has been in flight for the whole timeout, every
//     member whose heartbeat did not change for the stale window (half the timeout, at least
//     1 s) is not responding: the watchdog writes "<prefix>/hung/<sequence number>" naming each
//     such rank (group and global rank), the collective, its sequence number, how long it has
//     been in flight and the rank's last state, then calls the group's abort function, which
//     fails this rank's blocked transfers (and, by closing its connections, its peers'). A
//     report a peer already wrote is adopted at once.
//
// A member that is alive but slow (its heartbeat advances) is never reported: a collective
// that is merely long keeps its full deadline. The group reads the report back with
// HangReport() to fail the collective with it (DeadlineExceeded) instead of with the
// transport's "connection closed".
//
// Cost: one store set per heartbeat interval per group, plus one read per member and interval
// while a collective is in flight longer than half the straggler timeout.
//
// Ownership: one per group, owned by the group; shares the store; owns its thread, joined by the
// destructor. Thread-safety: Started/Finished/HangReport/aborted are called by the group's rank
// thread; the watchdog thread reads the in-flight state under a mutex and calls `abort` from its
// own thread (at most once), so `abort` must be safe to call while the rank thread is blocked in
// the collective.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/distributed/collective_info.h"
#include "engine/distributed/store/store.h"

namespace fsdp::distributed {

class CollectiveWatchdog {
 public:
  // Fails the collective in flight on this rank; `report` says why.
  using AbortFn = std::function<void(const std::string& report)>;

  // `store` is the group's own namespace (a PrefixStore); `global_ranks[r]` is group rank r's
  // world rank; `timeout` > 0 is the straggler timeout. Starts the thread.
  CollectiveWatchdog(std::shared_ptr<Store> store, int rank, std::vector<int> global_ranks,
                     std::chrono::milliseconds timeout, AbortFn abort);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // `info` is in flight on this rank (every member reached it).
  void Started(const CollectiveInfo& info);
  // The collective in flight returned, successfully or not.
  void Finished();
  // The report that a member hangs in collective `sequence_number`: this watchdog's or one a
  // peer wrote to the store; nullopt when there is none.
  std::optional<std::string> HangReport(uint64_t sequence_number);
  // The report on which this watchdog aborted the group; nullopt while it has not.
  std::optional<std::string> aborted() const;

  std::chrono::milliseconds heartbeat_interval() const { return interval_; }

 private:
  struct Peer {
    std::optional<std::string> beat;                   // its heartbeat when last sampled
    std::chrono::steady_clock::time_point changed_at;  // when it was last seen changing
  };

  static std::string HeartbeatKey(int rank);
  static std::string HungKey(uint64_t sequence_number);
  void Run();
  // One tick: the heartbeat, then the hang check of the collective in flight (if any).
  void Tick(uint64_t beat);
  // The report naming `stuck` (group ranks) for the collective in flight since `since`.
  std::string Report(const CollectiveInfo& info, std::chrono::steady_clock::time_point since,
                     const std::vector<int>& stuck);
  // Aborts the group once, if collective `sequence_number` is still in flight.
  void Abort(uint64_t sequence_number, const std::string& report);

  std::shared_ptr<Store> store_;
  int rank_;
  std::vector<int> global_ranks_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds stale_after_;
  AbortFn abort_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<CollectiveInfo> in_flight_;         // guarded by mu_
  std::chrono::steady_clock::time_point started_;   // guarded by mu_
  // The last collective this rank finished (formatted only by the heartbeat). Guarded by mu_.
  std::optional<CollectiveInfo> last_completed_;
  std::optional<std::string> aborted_;              // guarded by mu_
  // Watchdog thread only: the members' heartbeats sampled for the collective in flight.
  uint64_t sampled_sequence_ = 0;
  std::map<int, Peer> peers_;
  std::thread thread_;
};

}  // namespace fsdp::distributed
