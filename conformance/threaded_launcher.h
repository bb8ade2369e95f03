// ThreadedLauncher: runs a case's ranks as std::threads of this process (named
// "fsdp-rank-N" for debuggers). Each rank thread gets its own fsdp::RankContext (installed
// with RankContextGuard, so per-rank state such as the RNG, memory statistics and observers is
// separate) and its world group from the backend's factory, which is also the rank's default
// group (distributed::GetDefaultProcessGroup), then calls the subject's RunRank. Collective waits get
// 90% of the case's deadline.
//
// With fakes::ThreadedProcessGroup groups the launcher also keeps the ThreadedWorld informed
// (AttachRankContext, MarkRankReturned, MarkRankFailed), as fakes::RunRanks does: when a rank
// throws, peers blocked in a collective fail at once with Aborted naming it.
//
// A rank still running at the deadline (or after the failure grace period, once another rank
// failed) cannot be killed: its thread is detached and keeps only state it owns (shared with
// the thread), and the rank is reported as DeadlineExceeded or Aborted. The process-group
// timeout of the fake process group normally ends such a thread soon after.
//
// The threads, contexts, ThreadedWorld bookkeeping, deadline, grace period and teardown are
// fakes::LaunchRankThreads' (fakes/thread_launcher.h); this class adds the groups from the
// backend, the rank's RankEnv and the mapping to RankOutcome.
//
// Ownership: holds the factory and shares the subject. Thread-safety: one Launch at a time.
#pragma once

#include <memory>

#include "conformance/launcher.h"
#include "conformance/subject.h"
#include "engine/distributed/backend_registry.h"

namespace fsdp::conformance {

class ThreadedLauncher final : public RankLauncher {
 public:
  // `backend` must place ranks as threads; its factory may be unset only for single-rank
  // cases (the rank then gets no group). Rank r runs on backend.DeviceOf(r).
  ThreadedLauncher(distributed::BackendSpec backend, std::shared_ptr<const Subject> subject);

  std::vector<RankOutcome> Launch(const LaunchRequest& request) override;

 private:
  distributed::BackendSpec backend_;
  std::shared_ptr<const Subject> subject_;
};

// Runs `body` on the calling thread, turning what it throws into the outcome (fsdp::Error keeps
// its code; CaseSkipped becomes a skip; anything else is Internal). Shared by the launchers and
// the worker process.
RankOutcome RunGuarded(const std::function<nlohmann::json()>& body);

}  // namespace fsdp::conformance
