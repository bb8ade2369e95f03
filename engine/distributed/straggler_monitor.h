// StragglerMonitor: names the ranks that have not reached a collective, well before the
// collective's own deadline, for process groups whose ranks are processes (Gloo), where a
// missing peer otherwise shows only as an anonymous timeout. In the spirit of c10d's
// monitored_barrier: before a collective, every rank announces its arrival through the store
// ("<prefix>/arrive/<sequence number>/<group rank>", valued with the collective's description)
// and waits up to the straggler timeout for every other member's announcement. A rank that
// waited that long writes "<prefix>/failed/<sequence number>" and fails with
// Error(kDeadlineExceeded) naming each missing rank (group and global rank), the collective and
// its sequence number, and the missing rank's last collective (its announcement of the previous
// sequence number: a rank that announced it completed it, as every other member did). A rank
// that arrives after a peer gave up finds that key and fails at once with the peer's report,
// instead of waiting in a collective nobody else runs. A rank whose group is destroyed (its
// function returned, its process is ending) writes "<prefix>/left/<group rank>"; the ranks
// waiting for it fail at once naming it, instead of waiting out the timeout.
//
// Cost: one store set and one wait per collective (plus a read of the failure key); only groups
// with a positive straggler timeout create a monitor.
//
// Ownership: one per group, owned by the group; shares the store.
// Thread-safety: used by the group's rank thread only (the store is thread-safe).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/distributed/collective_info.h"
#include "engine/distributed/store/store.h"

namespace fsdp::distributed {

class StragglerMonitor {
 public:
  // `store` is the group's own namespace (a PrefixStore); `global_ranks[r]` is group rank r's
  // world rank; `timeout` > 0.
  StragglerMonitor(std::shared_ptr<Store> store, int rank, std::vector<int> global_ranks,
                   std::chrono::milliseconds timeout);

  // Announces this rank's arrival at `info` and returns once every member announced its own;
  // throws kDeadlineExceeded naming the ranks that did not within the timeout (or that a peer
  // already gave up on this collective).
  void Arrive(const CollectiveInfo& info);

  // Announces that this rank leaves the group (it issues no further collective on it). Never
  // throws: a store that is gone already is ignored.
  void Leave() noexcept;

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  static std::string ArriveKey(uint64_t sequence_number, int rank);
  static std::string FailedKey(uint64_t sequence_number);
  static std::string LeftKey(int rank);
  // "rank 3 (global rank 3) last issued #4 allreduce_ ..." for a rank that did not arrive at
  // `sequence_number`.
  std::string DescribeMissing(uint64_t sequence_number, int rank);

  std::shared_ptr<Store> store_;
  int rank_;
  std::vector<int> global_ranks_;
  std::chrono::milliseconds timeout_;
  std::string last_arrived_;  // the description of the last collective this rank arrived at
};

}  // namespace fsdp::distributed
