// ProcessGroup: the collective-communication interface every backend implements (the
// in-process ThreadedProcessGroup of fakes/, GlooProcessGroup, NcclProcessGroup).
//
// The public collective methods are non-virtual. Each one validates its arguments (shapes,
// dtypes, aliasing, root, reduce op), builds the CollectiveInfo of the call (c10d op name,
// per-group sequence number, shapes), records it to the flight recorder and to every active
// CommDebugMode of the calling rank, and then calls the protected virtual *_impl that the
// backend provides. Recording therefore happens for every backend automatically; a call made
// from inside another ProcessGroup call on the same rank (a decorator forwarding to the group
// it wraps) is not recorded a second time. See docs/process_groups.md.
//
// Semantics (as torch.distributed): every rank of the group issues the same collectives in the
// same order with matching dtypes and element counts. Outputs may alias inputs where c10d
// allows (in place): all_gather_into_tensor's input may be the output's chunk `rank()`,
// reduce_scatter_tensor's output may be the input's chunk `rank()`. `root` arguments are
// group ranks (c10d's BroadcastOptions::rootRank); use group_rank(global) to convert. Every
// blocking wait has a deadline (timeout()); running past it throws Error(kDeadlineExceeded)
// naming the op, the group and the sequence number. Tensor arguments are handles, so outputs
// are passed as const Tensor& and written through.
//
// Ownership: shared (std::shared_ptr) by the FSDP states and meshes that use it.
// Thread-safety: a ProcessGroup object is used by its own rank's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/distributed/collective_info.h"
#include "engine/distributed/reduce_op.h"
#include "engine/distributed/work.h"

namespace fsdp::distributed {

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;  // "threaded", "gloo", "nccl"
  // The global ranks of this group's members, in group-rank order (ascending).
  virtual std::vector<int> global_ranks() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  // c10d-style group name: "0" for the world, its subgroups "1", "2", ... in creation order,
  // a subgroup's own subgroups "1.1", "1.2", ... (the same on every backend).
  virtual std::string group_name() const = 0;
  // The device of the tensors this group communicates: the CPU for the threaded and Gloo
  // groups, this rank's CUDA device for NCCL (PyTorch's `_get_pg_default_device`). Collectives
  // of metadata (flags, hashes, paths) allocate their tensors here.
  virtual Device default_device() const { return Device::CPU(); }

  // This rank's global rank.
  int global_rank() const;
  // The group rank of `global_rank`, or -1 when it is not a member.
  int group_rank(int global_rank) const;
  // Collectives issued on this group object so far (the last one's sequence number).
  uint64_t sequence_number() const { return sequence_number_; }
  // "group 0 (gloo, rank 1/4)".
  std::string describe() const;

  // c10d `_allgather_base_`: output = concat over ranks of input (rank-major); output numel =
  // size() * input numel; input may be output's chunk rank() (in place).
  std::shared_ptr<Work> all_gather_into_tensor(const Tensor& output, const Tensor& input,
                                               bool async_op = false);
  // c10d `_reduce_scatter_base_`: output = this rank's chunk of reduce(input over ranks);
  // input numel = size() * output numel; output may be input's chunk rank() (in place).
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                              ReduceOptions options = {}, bool async_op = false);
  // c10d `allreduce_`: tensor = reduce(tensor over ranks), in place.
  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOptions options = {},
                                   bool async_op = false);
  // c10d `broadcast_`: tensor = tensor of group rank `root`.
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root, bool async_op = false);
  // c10d `allgather_`: outputs[r] = input of rank r. outputs has size() tensors of the input's
  // dtype; outputs[r] numel must equal rank r's input numel (sizes may differ by rank).
  std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input,
                                   bool async_op = false);
  // c10d `barrier`: returns when every rank of the group has entered it.
  void barrier();

  // torch.distributed.new_group: a subgroup over `ranks` (global ranks, any order; the group
  // ranks follow ascending global rank). Every rank of this group must call it with the same
  // list, in the same order relative to its other collectives; returns nullptr on ranks that
  // are not members.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);

 protected:
  ProcessGroup() = default;

  // Backends implement these. Arguments are validated; `info` describes the call (op,
  // sequence number, shapes) for checkers and error messages.
  virtual std::shared_ptr<Work> all_gather_into_tensor_impl(const Tensor& output,
                                                            const Tensor& input,
                                                            const CollectiveInfo& info) = 0;
  virtual std::shared_ptr<Work> reduce_scatter_tensor_impl(const Tensor& output,
                                                           const Tensor& input,
                                                           const ReduceOptions& options,
                                                           const CollectiveInfo& info) = 0;
  virtual std::shared_ptr<Work> all_reduce_impl(const Tensor& tensor, const ReduceOptions& options,
                                                const CollectiveInfo& info) = 0;
  virtual std::shared_ptr<Work> broadcast_impl(const Tensor& tensor, int root,
                                               const CollectiveInfo& info) = 0;
  virtual std::shared_ptr<Work> all_gather_impl(const std::vector<Tensor>& outputs,
                                                const Tensor& input,
                                                const CollectiveInfo& info) = 0;
  virtual void barrier_impl(const CollectiveInfo& info) = 0;
  // `ranks` is sorted, unique, within global_ranks(); `info` (op new_group) carries them.
  virtual std::shared_ptr<ProcessGroup> new_group_impl(const std::vector<int>& ranks,
                                                       const CollectiveInfo& info) = 0;

 private:
  CollectiveInfo MakeInfo(CollectiveOp op, bool async_op);
  template <typename Fn>
  auto Issue(const CollectiveInfo& info, Fn&& fn);

  uint64_t sequence_number_ = 0;
};

// Per-rank default ("world") group, like torch.distributed's default process group: set by
// RunRanks for each rank thread and by the launcher; read by code that takes no explicit
// group. Stored in the calling rank's RankContext.
void SetDefaultProcessGroup(std::shared_ptr<ProcessGroup> group);
// Throws FailedPrecondition when none was set on this rank.
std::shared_ptr<ProcessGroup> GetDefaultProcessGroup();
bool HasDefaultProcessGroup();

}  // namespace fsdp::distributed
