// ProcessGroup: the collective-communication interface every backend implements (the
// in-process ThreadedProcessGroup of fakes/, GlooProcessGroup, NcclProcessGroup), and Work, the
// handle of an issued collective. Collective names follow c10d (`_allgather_base_`,
// `_reduce_scatter_base_`, `allreduce_`, `broadcast_`, `allgather_`, `barrier`) so CommDebugMode
// counts read like PyTorch's.
//
// Semantics (as torch.distributed): every rank of the group must issue the same collectives in
// the same order with matching dtypes and element counts. Tensors may be in place (output
// aliases input where the op allows) or out of place. Every blocking wait has a deadline
// (timeout()); running past it throws Error(kDeadlineExceeded) naming the op and the group.
// Ownership: shared (std::shared_ptr) by the FSDP states and meshes that use it.
// Thread-safety: a ProcessGroup object is used by its own rank's thread only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::dist {

enum class ReduceOp { kSum, kAvg, kMin, kMax, kPremulSum };
const char* ReduceOpName(ReduceOp op);  // "SUM", "AVG", "MIN", "MAX", "PREMUL_SUM"

struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;  // Default: SUM
  double premul_factor = 1.0;    // Default: 1.0; used by kPremulSum (inputs scaled first)
};

// The handle of an issued collective. wait() blocks until it is complete (or throws when the
// collective failed or the deadline passed) and may be called more than once.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};

// A Work that is already complete (synchronous backends).
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;  // "threaded", "gloo", "nccl"
  // The global ranks of this group's members, in group-rank order.
  virtual std::vector<int> global_ranks() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // output = concat over ranks of input (rank-major); output numel = size() * input numel.
  virtual std::shared_ptr<Work> all_gather_into_tensor(Tensor& output, const Tensor& input,
                                                       bool async_op = false) = 0;
  // output = this rank's chunk of reduce(input); input numel = size() * output numel.
  virtual std::shared_ptr<Work> reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                                      ReduceOptions options = {},
                                                      bool async_op = false) = 0;
  virtual std::shared_ptr<Work> all_reduce(Tensor& tensor, ReduceOptions options = {},
                                           bool async_op = false) = 0;
  virtual std::shared_ptr<Work> broadcast(Tensor& tensor, int root, bool async_op = false) = 0;
  // outputs[r] = input of rank r (shapes may differ per rank only in numel as torch allows:
  // each outputs[r] must match rank r's input numel).
  virtual std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs, const Tensor& input,
                                           bool async_op = false) = 0;
  virtual void barrier() = 0;

  // A subgroup over `ranks` (global ranks, ascending). Must be called by every member of this
  // group with the same list, like torch.distributed.new_group; returns nullptr on ranks that
  // are not members.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;
};

}  // namespace fsdp::dist
