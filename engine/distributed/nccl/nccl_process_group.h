// NcclProcessGroup: ProcessGroup over NCCL, one CUDA device per rank (ranks are processes, or
// threads of one process with one device each). Written after PyTorch's ProcessGroupNCCL;
// see docs/process_groups.md, "NCCL", for the design and for what has been run on a GPU.
//
//   auto store = std::make_shared<distributed::FileStore>(dir);  // or TcpStore, HashStore
//   auto pg = distributed::NcclProcessGroup::Create(store, rank, world, Device::CUDA(local_rank));
//   pg->all_reduce(t);                                // t: a CUDA tensor on cuda:local_rank
//
// Rendezvous: rank 0 creates an ncclUniqueId and publishes it in the rendezvous Store
// (engine/distributed/store/) under "<prefix>/nccl/pg0/unique_id"; every rank
// then calls ncclCommInitRankConfig with a nonblocking config (so that ncclCommAbort can
// interrupt a stuck communicator) and polls ncclCommGetAsyncError until it is ready or the
// timeout passes. Subgroups (new_group) are ncclCommSplit of the parent communicator: members
// pass color 0 and their position as key, non-members NCCL_SPLIT_NOCOLOR and get nullptr.
//
// Streams (ProcessGroupNCCL's ncclStreams_): every collective runs on the group's own
// non-blocking communication stream, which first waits (cudaStreamWaitEvent) on an event
// recorded on the caller's current stream (fsdp::CurrentCudaStream, engine/core/cuda_stream.h)
// of this rank's device; completion is an event recorded on the communication stream after the
// op. Input and output tensors are kept alive by the group until that event completes.
//
// Work and deadlines: the returned Work's wait() first makes the caller's current stream wait
// on the completion event (WorkNCCL::synchronizeStream), then blocks the host, polling
// cudaEventQuery and ncclCommGetAsyncError until the work completes or the deadline passes
// (TORCH_NCCL_BLOCKING_WAIT). On expiry it calls ncclCommAbort, as ProcessGroupNCCL's
// watchdog does, and throws Error(kDeadlineExceeded) naming the op, sequence number and group.
// Synchronous calls (async_op = false) wait like that before returning, so every blocking
// path has a deadline; async_op = true returns at once. An asynchronous NCCL error aborts the
// communicator too. After an abort the group refuses collectives (kFailedPrecondition).
//
// Tensors must be CUDA tensors on this rank's device; dtypes f32, f64, f16, bf16, i64; reduce
// ops SUM, AVG (ncclAvg), MIN, MAX and PREMUL_SUM (ncclRedOpCreatePreMulSum with the rank's
// factor, destroyed after the call). NCCL reduces in its own order and precision (16-bit
// payloads are summed in 16 bits), so results match the threaded fake exactly only where the
// arithmetic is exact.
//
// This header needs neither CUDA nor NCCL headers; its definitions exist only in builds with
// NCCL (FSDP_HAVE_NCCL in fsdp/config.h).
// Ownership: a group owns its communicator, stream and events; Works share the communicator
// handle, so a Work may outlive its group (waiting on it then only queries its event).
// Thread-safety: a group is used by its rank's thread only (as every ProcessGroup); a Work
// may be waited on from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/distributed/store/store.h"
#include "engine/distributed/process_group.h"

namespace fsdp::distributed {

struct NcclOptions {
  // Deadline of rendezvous, communicator creation and every collective. Default: 30 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Store key prefix, to host several worlds in one store. Default: "".
  std::string prefix;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  // The world group of `world_size` ranks on `device` (this rank's GPU, e.g. cuda:LOCAL_RANK).
  // Collective over the ranks. Throws InvalidArgument for a non-CUDA device, Unavailable when
  // the device is not visible ("no CUDA device visible" without a GPU), DeadlineExceeded when
  // the rendezvous or ncclCommInitRankConfig does not finish within options.timeout.
  static std::shared_ptr<NcclProcessGroup> Create(std::shared_ptr<Store> store, int rank,
                                                  int world_size, Device device,
                                                  NcclOptions options = {});
  ~NcclProcessGroup() override;

  int rank() const override;
  int size() const override;
  std::string backend_name() const override { return "nccl"; }
  Device default_device() const override { return device(); }
  std::vector<int> global_ranks() const override;
  std::chrono::milliseconds timeout() const override;
  std::string group_name() const override;
  // This rank's CUDA device.
  Device device() const;

  // ProcessGroupNCCL::abort: ncclCommAbort on this group's communicator (pending collectives
  // are interrupted); later collectives throw kFailedPrecondition naming `reason`. Idempotent.
  void abort(const std::string& reason = "abort() was called");
  bool is_aborted() const;

  struct State;  // communicator, stream, events, in-flight works (nccl_process_group.cc)

 protected:
  std::shared_ptr<Work> all_gather_into_tensor_impl(const Tensor& output, const Tensor& input,
                                                    const CollectiveInfo& info) override;
  std::shared_ptr<Work> reduce_scatter_tensor_impl(const Tensor& output, const Tensor& input,
                                                   const ReduceOptions& options,
                                                   const CollectiveInfo& info) override;
  std::shared_ptr<Work> all_reduce_impl(const Tensor& tensor, const ReduceOptions& options,
                                        const CollectiveInfo& info) override;
  std::shared_ptr<Work> broadcast_impl(const Tensor& tensor, int root,
                                       const CollectiveInfo& info) override;
  std::shared_ptr<Work> all_gather_impl(const std::vector<Tensor>& outputs, const Tensor& input,
                                        const CollectiveInfo& info) override;
  void barrier_impl(const CollectiveInfo& info) override;
  std::shared_ptr<ProcessGroup> new_group_impl(const std::vector<int>& ranks,
                                               const CollectiveInfo& info) override;

 private:
  explicit NcclProcessGroup(std::unique_ptr<State> state);

  std::unique_ptr<State> state_;
};

}  // namespace fsdp::distributed
