// RecordingProcessGroup: a decorator that appends every collective its rank issues (op,
// group, sequence number, dtype, shapes/numels, reduce op, root, in place, async) to a
// CollectiveTrace, then forwards to the wrapped group. One trace is usually shared by all
// ranks of a run (entries carry the global rank), so a test can compare the ranks' sequences
// or assert an exact per-rank sequence.
//
// Ownership: the trace is shared (shared_ptr) by every decorator that writes to it;
// subgroups created through the decorator share their parent's trace.
// Thread-safety: CollectiveTrace is synchronised; the decorator is used by its rank's thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/distributed/collective_info.h"
#include "fakes/process_group_wrapper.h"

namespace fsdp::fakes {

class CollectiveTrace {
 public:
  void Add(const distributed::CollectiveInfo& info);
  // Every entry, in the order they were recorded (interleaving of ranks is not specified).
  std::vector<distributed::CollectiveInfo> All() const;
  // The entries of one global rank, in its issue order.
  std::vector<distributed::CollectiveInfo> ForRank(int global_rank) const;
  // One line per entry of `global_rank`: "allreduce_ group=0 float32 numel=4 SUM".
  std::vector<std::string> OpLines(int global_rank) const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::vector<distributed::CollectiveInfo> entries_;
};

// "allreduce_ group=0 float32 numel=4 SUM" (stable, for expectations).
std::string TraceLine(const distributed::CollectiveInfo& info);

class RecordingProcessGroup final : public ProcessGroupWrapper {
 public:
  explicit RecordingProcessGroup(
      std::shared_ptr<distributed::ProcessGroup> inner,
      std::shared_ptr<CollectiveTrace> trace = std::make_shared<CollectiveTrace>());
  const std::shared_ptr<CollectiveTrace>& trace() const { return trace_; }

 protected:
  std::shared_ptr<distributed::ProcessGroup> Wrap(std::shared_ptr<distributed::ProcessGroup> inner) override;
  std::shared_ptr<distributed::Work> Intercept(const distributed::CollectiveInfo& info,
                                        const std::vector<Tensor>& outputs,
                                        const Forward& forward) override;

 private:
  std::shared_ptr<CollectiveTrace> trace_;
};

}  // namespace fsdp::fakes
