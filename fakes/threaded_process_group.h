// ThreadedProcessGroup: N ranks as threads of one process, like PyTorch's threaded fake
// process group (torch/testing/_internal/distributed/multi_threaded_pg.py), with a collective
// checker and deadlines so that bugs fail on every rank with a report instead of hanging.
//
// A ThreadedWorld is the shared state of one run (RunRanks creates it): the world's groups,
// every rank's status and flight recorder, and the abort flag. Each rank holds its own
// ThreadedProcessGroup handle per group.
//
// Collectives rendezvous per group and sequence: the k-th collective a rank issues on a group
// meets the k-th of every other member. The last rank to arrive first compares the
// fingerprints of all participants ([Note: collective fingerprint] in
// engine/distributed/collective_info.h); on a mismatch every participant throws Error(kDataLoss)
// showing rank 0's call and each differing rank's call. Otherwise every participant's thread
// performs its own share of the collective (copies into its own outputs, reduces its own chunk
// or slice), so a collective uses as many cores as there are ranks; reductions are in rank
// order (engine/distributed/reduce_op.h), so results are bit-identical on every rank and to a
// single-threaded reduction of the whole buffers.
//
// Failures (see docs/process_groups.md, [Note: threaded abort semantics]):
//  * a participant waiting longer than the world's timeout fails the collective for every
//    participant with Error(kDeadlineExceeded) listing the missing ranks and what each last
//    issued (flight recorder) and its status;
//  * a rank whose function threw aborts the world: collectives waiting or issued later throw
//    Error(kAborted) naming the failed rank and its error;
//  * a rank whose function returned can never join again: collectives that need it throw
//    Error(kUnavailable) at once.
// CUDA tensors are staged through host memory. async_op=true completes before returning.
//
// Ownership: ThreadedWorld is shared by the handles and the runner; handles are owned by the
// rank's code (shared_ptr).
// Thread-safety: ThreadedWorld is fully synchronised (one mutex, a condition variable per
// pending collective, no spinning). A handle is used by its rank's thread only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/rank_context.h"
#include "engine/distributed/flight_recorder.h"
#include "engine/distributed/process_group.h"

namespace fsdp::fakes {

namespace internal {
struct GroupState;
struct Participant;
}  // namespace internal

class ThreadedWorld : public std::enable_shared_from_this<ThreadedWorld> {
 public:
  // `timeout`: the deadline of every collective wait.
  static std::shared_ptr<ThreadedWorld> Create(int world_size, std::chrono::milliseconds timeout);
  ~ThreadedWorld();

  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // The world group's handle for `rank`; at most once per rank.
  std::shared_ptr<distributed::ProcessGroup> CreateWorldGroup(int rank);
  // Lets reports read `rank`'s flight recorder (shared: the context may die first).
  void AttachRankContext(int rank, RankContext* context);
  // The rank's function returned: collectives that still need it fail with kUnavailable.
  void MarkRankReturned(int rank);
  // The rank's function threw `what`: aborts the world.
  void MarkRankFailed(int rank, const std::string& what);
  // Fails every waiting and future collective with kAborted and `reason`. Only the first
  // abort's reason is kept.
  void Abort(const std::string& reason);
  bool aborted() const;
  // Every rank's status and last collectives (flight recorder), for hang reports.
  std::string Report() const;
  // Time of the last progress (a join, a completion, a rank finishing), for stall watchdogs.
  std::chrono::steady_clock::time_point last_progress() const;
  // Blocks until every rank returned or failed, or until `deadline`; true when all finished.
  bool WaitAllFinished(std::chrono::steady_clock::time_point deadline) const;

 private:
  friend class ThreadedProcessGroup;
  enum class RankStatus { kRunning, kReturned, kFailed };
  struct RankState {
    RankStatus status = RankStatus::kRunning;
    std::string error;
    std::shared_ptr<distributed::FlightRecorder> recorder;
    bool world_group_created = false;
  };

  ThreadedWorld(int world_size, std::chrono::milliseconds timeout);
  // Joins `participant` into the group's next rendezvous and returns when the collective
  // completed (or throws). `index` is the handle's rendezvous counter.
  void Join(internal::GroupState& group, int group_rank, uint64_t index,
            internal::Participant& participant);
  void NotifyAllPending();                               // requires mu_
  std::string RankLine(int rank, size_t entries) const;  // requires mu_
  std::shared_ptr<internal::GroupState> NewGroupState(const std::string& name,
                                                      const std::vector<int>& ranks);  // mu_
  std::string Describe(const internal::GroupState& group) const;

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  mutable std::condition_variable finished_cv_;
  bool aborted_ = false;
  std::string abort_reason_;
  int finished_ranks_ = 0;
  std::vector<RankState> ranks_;
  std::shared_ptr<internal::GroupState> world_group_;
  std::vector<std::weak_ptr<internal::GroupState>> groups_;
  std::chrono::steady_clock::time_point last_progress_;
};

// The world groups of a new ThreadedWorld, element r for rank r, for launchers that start the
// rank threads themselves (RunRanks does all of this). Such a launcher should, per rank
// thread: AttachRankContext(r, &context) for reports, then MarkRankReturned(r) or
// MarkRankFailed(r, what) when the rank's code ends, so that peers fail promptly;
// static_cast<ThreadedProcessGroup&>(*groups[r]).world() reaches the world.
std::vector<std::shared_ptr<distributed::ProcessGroup>> MakeThreadedWorldGroups(
    int world_size, std::chrono::milliseconds timeout);

class ThreadedProcessGroup final : public distributed::ProcessGroup {
 public:
  ThreadedProcessGroup(std::shared_ptr<ThreadedWorld> world,
                       std::shared_ptr<internal::GroupState> group, int group_rank);
  ~ThreadedProcessGroup() override;

  int rank() const override { return group_rank_; }
  int size() const override;
  std::string backend_name() const override { return "threaded"; }
  std::vector<int> global_ranks() const override;
  std::chrono::milliseconds timeout() const override { return world_->timeout(); }
  std::string group_name() const override;
  ThreadedWorld& world() const { return *world_; }

 protected:
  std::shared_ptr<distributed::Work> all_gather_into_tensor_impl(
      const Tensor& output, const Tensor& input, const distributed::CollectiveInfo& info) override;
  std::shared_ptr<distributed::Work> reduce_scatter_tensor_impl(const Tensor& output, const Tensor& input,
                                                         const distributed::ReduceOptions& options,
                                                         const distributed::CollectiveInfo& info) override;
  std::shared_ptr<distributed::Work> all_reduce_impl(const Tensor& tensor,
                                              const distributed::ReduceOptions& options,
                                              const distributed::CollectiveInfo& info) override;
  std::shared_ptr<distributed::Work> broadcast_impl(const Tensor& tensor, int root,
                                             const distributed::CollectiveInfo& info) override;
  std::shared_ptr<distributed::Work> all_gather_impl(const std::vector<Tensor>& outputs,
                                              const Tensor& input,
                                              const distributed::CollectiveInfo& info) override;
  void barrier_impl(const distributed::CollectiveInfo& info) override;
  std::shared_ptr<distributed::ProcessGroup> new_group_impl(const std::vector<int>& ranks,
                                                     const distributed::CollectiveInfo& info) override;

 private:
  void Run(internal::Participant& participant);
  std::shared_ptr<distributed::Work> Done(const distributed::CollectiveInfo& info) const;

  std::shared_ptr<ThreadedWorld> world_;
  std::shared_ptr<internal::GroupState> group_;
  int group_rank_;
  uint64_t next_index_ = 0;
};

}  // namespace fsdp::fakes
