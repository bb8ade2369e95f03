#include "engine/distributed/nccl/nccl_process_group.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
#include "engine/core/error.h"
#include "engine/distributed/flight_recorder.h"
#include "engine/distributed/nccl/nccl_utils.h"

namespace fsdp::distributed {

namespace {

using Clock = std::chrono::steady_clock;
// Builds the prefix of an error message; only called when something failed.
using ContextFn = std::function<std::string()>;
using nccl_internal::CudaErrorCode;
using nccl_internal::FormatCudaError;
using nccl_internal::FormatNcclError;
using nccl_internal::NcclErrorCode;
using nccl_internal::NcclLastError;
using nccl_internal::ThrowNcclError;

// Pauses between polls: yields for the first 100 polls (a collective that is about to finish),
// then sleeps 10 us doubling up to 1 ms, so a long wait costs little CPU.
class Backoff {
 public:
  void Pause() {
    if (polls_ < 100) {
      ++polls_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int polls_ = 0;
  std::chrono::microseconds sleep_{10};
};

// Makes `index` the calling thread's CUDA device for a scope and restores the previous one
// (c10::cuda::CUDAGuard). The constructor throws on a CUDA error; the destructor never does.
class DeviceGuard {
 public:
  DeviceGuard(int index, const ContextFn& context) : index_(index) {
    FSDP_CUDA_CHECK(cudaGetDevice(&previous_), context());
    if (previous_ != index_) FSDP_CUDA_CHECK(cudaSetDevice(index_), context());
  }
  ~DeviceGuard() {
    if (previous_ != index_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int index_;
  int previous_ = -1;
};

// Non-throwing variant for destructors and abort paths.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int index) : index_(index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != index_) cudaSetDevice(index_);
  }
  ~QuietDeviceGuard() {
    if (previous_ >= 0 && previous_ != index_) cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int index_;
  int previous_ = -1;
};

std::string Ms(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

// Polls ncclCommGetAsyncError on every non-null communicator while any of them reports
// ncclInProgress (a nonblocking communicator still working on an init, split or enqueue),
// until `deadline`. Returns ncclSuccess, the first error, or ncclInProgress when the deadline
// passed first.
ncclResult_t PollInProgress(std::initializer_list<ncclComm_t> comms, Clock::time_point deadline) {
  Backoff backoff;
  for (;;) {
    bool in_progress = false;
    for (ncclComm_t c : comms) {
      if (c == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(c, &state);
      if (query != ncclSuccess) return query;
      if (state == ncclInProgress) {
        in_progress = true;
      } else if (state != ncclSuccess) {
        return state;
      }
    }
    if (!in_progress) return ncclSuccess;
    if (Clock::now() >= deadline) return ncclInProgress;
    backoff.Pause();
  }
}

}  // namespace

// ---- NcclComm -------------------------------------------------------------------------------

// The communicator of one group, shared by the group and its Works so that a Work can abort
// it when its deadline passes (ProcessGroupNCCL's NCCLComm).
// Ownership: owns the ncclComm_t until it is finalized/destroyed or aborted.
// Thread-safety: the state (handle, aborted, reason) is guarded by a mutex, and so are the
// calls that may race with an abort from a waiting thread (ncclCommGetAsyncError,
// ncclCommAbort, teardown). Enqueueing collectives uses raw() from the group's own thread
// without the lock, as ProcessGroupNCCL does with its watchdog.
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, int device, std::string group) : comm_(comm), device_(device),
                                                              group_(std::move(group)) {}
  ~NcclComm() {
    // Reached only when teardown did not run (e.g. a Work outlived a group whose teardown
    // failed): never leak a live communicator.
    Abort("the communicator handle was released");
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // The handle, or nullptr once finalized or aborted.
  ncclComm_t raw() const {
    std::lock_guard<std::mutex> lock(mu_);
    return comm_;
  }
  bool alive() const { return raw() != nullptr; }
  bool aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  std::string reason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }
  const std::string& group() const { return group_; }

  // ncclCommGetAsyncError; nullopt when the communicator is gone.
  std::optional<ncclResult_t> AsyncError() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ == nullptr) return std::nullopt;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    return query != ncclSuccess ? query : state;
  }
  std::string LastError() const {
    std::lock_guard<std::mutex> lock(mu_);
    return NcclLastError(comm_);
  }

  // ncclCommAbort (idempotent; the first reason is kept). Pending operations are interrupted
  // and the handle is freed.
  void Abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ == nullptr) return;
    QuietDeviceGuard guard(device_);
    const ncclResult_t r = ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
    reason_ = reason;
    if (r != ncclSuccess) {
      std::fprintf(stderr, "NcclProcessGroup: %s\n",
                   FormatNcclError("ncclCommAbort of group " + group_, r, "").c_str());
    }
  }

  // Graceful teardown: ncclCommFinalize (flushes pending operations), polled up to `timeout`,
  // then ncclCommDestroy. Falls back to ncclCommAbort when finalize fails or times out.
  void Finalize(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (comm_ == nullptr) return;
    QuietDeviceGuard guard(device_);
    ncclResult_t r = ncclCommFinalize(comm_);
    if (r == ncclInProgress) r = PollInProgress({comm_}, Clock::now() + timeout);
    if (r == ncclSuccess) {
      r = ncclCommDestroy(comm_);
      comm_ = nullptr;
      if (r != ncclSuccess) {
        std::fprintf(stderr, "NcclProcessGroup: %s\n",
                     FormatNcclError("ncclCommDestroy of group " + group_, r, "").c_str());
      }
      return;
    }
    const std::string what =
        r == ncclInProgress
            ? "ncclCommFinalize of group " + group_ + " did not finish within " + Ms(timeout)
            : FormatNcclError("ncclCommFinalize of group " + group_, r, "");
    std::fprintf(stderr, "NcclProcessGroup: %s; aborting the communicator\n", what.c_str());
    lock.unlock();
    Abort("the group was destroyed and ncclCommFinalize did not finish");
  }

 private:
  mutable std::mutex mu_;
  ncclComm_t comm_;
  int device_;
  std::string group_;
  bool aborted_ = false;
  std::string reason_;
};

namespace {

// Finishes an NCCL call on a nonblocking communicator: polls while it reports ncclInProgress
// (up to `deadline`), then throws on failure naming `call` and `context()`. A failure or an
// expired deadline aborts the communicator first (the collective was not issued on this rank,
// so its peers could only hang on it; the group is unusable afterwards).
template <typename ContextFn>
void FinishNcclCall(NcclComm& comm, ncclResult_t result, const char* call,
                    Clock::time_point deadline, std::chrono::milliseconds timeout,
                    ContextFn&& context) {
  if (result == ncclInProgress) result = PollInProgress({comm.raw()}, deadline);
  if (result == ncclSuccess) return;
  const std::string ctx = context();
  if (result == ncclInProgress) {
    comm.Abort(std::string(call) + " was still in progress after " + Ms(timeout));
    FSDP_THROW(ErrorCode::kDeadlineExceeded, ctx, ": ", call,
               " was still in progress (ncclInProgress) after ", Ms(timeout),
               "; the communicator was aborted (ncclCommAbort); this rank's last collectives:\n",
               CurrentFlightRecorder().Dump(4, "    "));
  }
  const std::string last = comm.LastError();
  comm.Abort(FormatNcclError(call, result, last));
  FSDP_THROW(NcclErrorCode(result), ctx, ": ", FormatNcclError(call, result, last),
             "; the communicator was aborted (ncclCommAbort)");
}

}  // namespace

// ---- NcclWork -------------------------------------------------------------------------------

// The Work of one NCCL collective (ProcessGroupNCCL's WorkNCCL): a completion event recorded
// on the group's communication stream after the op, the tensors the op reads and writes (kept
// alive until the event completes), and the communicator (to abort it on a deadline).
// Ownership: shared by the caller and the group's in-flight list; owns its event.
// Thread-safety: fully synchronised (wait/is_completed may be called from any thread).
class NcclWork final : public Work {
 public:
  NcclWork(std::string description, std::chrono::milliseconds timeout,
           std::shared_ptr<NcclComm> comm, int device, std::vector<Tensor> stash)
      : Work(std::move(description), timeout),
        comm_(std::move(comm)),
        device_(device),
        stash_(std::move(stash)) {}
  ~NcclWork() override {
    if (end_ != nullptr) cudaEventDestroy(end_);
  }

  // Creates the completion event (on the current device) and records it on `stream`.
  void RecordEnd(cudaStream_t stream, const ContextFn& context) {
    std::lock_guard<std::mutex> lock(mu_);
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&end_, cudaEventDisableTiming), context());
    FSDP_CUDA_CHECK(cudaEventRecord(end_, stream), context());
  }

  using Work::wait;
  // WorkNCCL::wait with blocking wait: the caller's current stream waits on the completion
  // event, then the host polls until the op completed, failed, or the deadline passed (then
  // the communicator is aborted and kDeadlineExceeded thrown).
  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (error_) throw *error_;
    if (!done_) {
      const ContextFn ctx = [&] { return "Work::wait: " + description(); };
      DeviceGuard guard(device_, ctx);
      FSDP_CUDA_CHECK(
          cudaStreamWaitEvent(CurrentCudaStream(Device::CUDA(device_)).handle, end_, 0), ctx());
    }
    const auto deadline = Clock::now() + timeout;
    Backoff backoff;
    while (!PollLocked()) {
      if (Clock::now() >= deadline) {
        const std::string reason = "Work::wait deadline of " + Ms(timeout) + " passed for " +
                                   description();
        comm_->Abort(reason);
        error_ = Error(
            ErrorCode::kDeadlineExceeded,
            "Work::wait: " + description() + " did not complete within " + Ms(timeout) +
                " on cuda:" + std::to_string(device_) + "; the NCCL communicator of group " +
                comm_->group() +
                " was aborted (ncclCommAbort, as ProcessGroupNCCL's watchdog does); this "
                "rank's last collectives:\n" +
                CurrentFlightRecorder().Dump(4, "    "));
        break;
      }
      lock.unlock();
      backoff.Pause();
      lock.lock();
    }
    if (error_) throw *error_;
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return PollLocked();
  }
  bool is_success() override {
    std::lock_guard<std::mutex> lock(mu_);
    return PollLocked() && !error_;
  }

 private:
  // One poll: true once the op completed or failed. Caller holds mu_.
  bool PollLocked() {
    if (done_ || error_) return true;
    if (end_ == nullptr) return false;  // not recorded yet
    const cudaError_t query = cudaEventQuery(end_);
    if (query == cudaSuccess) {
      done_ = true;
      stash_.clear();
      return true;
    }
    cudaGetLastError();  // cudaErrorNotReady is not an error; do not leave it behind
    if (query != cudaErrorNotReady) {
      error_ = Error(CudaErrorCode(query),
                     description() + ": " + FormatCudaError("cudaEventQuery", query));
      return true;
    }
    const std::optional<ncclResult_t> state = comm_->AsyncError();
    if (!state) {
      if (comm_->aborted()) {
        error_ = Error(ErrorCode::kAborted, description() + ": the NCCL communicator of group " +
                                                comm_->group() + " was aborted (" +
                                                comm_->reason() + ") before the op completed");
        return true;
      }
      return false;  // finalized: its pending operations were flushed; the event completes
    }
    if (*state != ncclSuccess && *state != ncclInProgress) {
      const std::string last = comm_->LastError();
      comm_->Abort("asynchronous NCCL error during " + description());
      error_ = Error(NcclErrorCode(*state),
                     description() + ": NCCL reported an asynchronous error: " +
                         FormatNcclError("ncclCommGetAsyncError", *state, last) +
                         "; the communicator was aborted (ncclCommAbort)");
      return true;
    }
    return false;
  }

  std::mutex mu_;
  std::shared_ptr<NcclComm> comm_;
  int device_;
  cudaEvent_t end_ = nullptr;
  std::vector<Tensor> stash_;
  bool done_ = false;
  std::optional<Error> error_;
};

// ---- State ----------------------------------------------------------------------------------

struct NcclProcessGroup::State {
  std::shared_ptr<Store> store;
  NcclOptions options;
  int rank = 0;
  int size = 1;
  std::vector<int> global_ranks;
  std::string name;
  Device device = Device::CUDA(0);
  std::shared_ptr<NcclComm> comm;
  cudaStream_t stream = nullptr;      // the communication stream (non-blocking)
  cudaEvent_t sync_event = nullptr;   // recorded on the caller's stream before every op
  void* barrier_buffer = nullptr;     // one float on the device, allocated by the first barrier
  int subgroups_created = 0;
  std::deque<std::shared_ptr<NcclWork>> inflight;  // issued, not yet seen complete

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    try {
      QuietDeviceGuard guard(device.index);
      if (comm) comm->Finalize(options.timeout);
      inflight.clear();
      if (barrier_buffer != nullptr) cudaFree(barrier_buffer);
      if (sync_event != nullptr) cudaEventDestroy(sync_event);
      if (stream != nullptr) cudaStreamDestroy(stream);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "NcclProcessGroup: teardown of group %s failed: %s\n", name.c_str(),
                   e.what());
    }
  }

  // "nccl group 0 (rank 1/4, global rank 1, cuda:1, timeout 30000 ms)".
  std::string Describe() const {
    std::ostringstream os;
    os << "nccl group " << name << " (rank " << rank << "/" << size << ", global rank "
       << global_ranks[static_cast<size_t>(rank)] << ", " << device.str() << ", timeout "
       << options.timeout.count() << " ms)";
    return os.str();
  }

  // The communication stream and the caller-sync event (device must be current).
  void CreateStreamAndEvent() {
    FSDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), Describe());
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&sync_event, cudaEventDisableTiming), Describe());
  }

  // Drops in-flight works whose ops completed (they complete in issue order on one stream).
  void CollectCompleted() {
    while (!inflight.empty() && inflight.front()->is_completed()) inflight.pop_front();
  }

  void CheckUsable(const CollectiveInfo& info) const {
    if (comm->alive()) return;
    FSDP_THROW(ErrorCode::kFailedPrecondition, "[", info.str(), "] ", Describe(),
               " is unusable: its NCCL communicator was ",
               comm->aborted() ? "aborted: " + comm->reason() : std::string("destroyed"));
  }

  void CheckTensor(const Tensor& t, const std::string& what, const CollectiveInfo& info) const {
    const Device d = t.device();
    FSDP_CHECK(d == device, "[", info.str(), "] ", Describe(), ": ", what, " ", t.str(),
               " is on ", d.str(), "; the NCCL backend needs CUDA tensors on this rank's device ",
               device.str());
  }
};

namespace {

using State = NcclProcessGroup::State;

// The ncclRedOp_t of one call: a built-in op, or a PREMUL_SUM op created for this call with
// this rank's factor (ncclScalarHostImmediate: NCCL copies the scalar at creation) and
// destroyed right after the collective was enqueued, as ProcessGroupNCCL does.
// Ownership: owns a created op. Thread-safety: one call on the group's thread.
class ScopedRedOp {
 public:
  template <typename ContextFn>
  ScopedRedOp(NcclComm& comm, const ReduceOptions& options, DType dtype,
              Clock::time_point deadline, std::chrono::milliseconds timeout, ContextFn&& context)
      : comm_(comm) {
    if (options.op != ReduceOp::kPremulSum) {
      op_ = nccl_internal::ToNcclRedOp(options.op);
      return;
    }
    nccl_internal::PremulScalar scalar =
        nccl_internal::EncodePremulScalar(options.premul_factor, dtype);
    const ncclResult_t r =
        ncclRedOpCreatePreMulSum(&op_, scalar.data(), nccl_internal::ToNcclDataType(dtype),
                                 ncclScalarHostImmediate, comm.raw());
    FinishNcclCall(comm, r, "ncclRedOpCreatePreMulSum", deadline, timeout, context);
    created_ = true;
  }
  ~ScopedRedOp() {
    // Only reached with created_ when the collective failed; the communicator is then
    // aborted (which frees its ops) or the destroy is best effort.
    if (created_ && comm_.alive()) ncclRedOpDestroy(op_, comm_.raw());
  }
  ScopedRedOp(const ScopedRedOp&) = delete;
  ScopedRedOp& operator=(const ScopedRedOp&) = delete;

  ncclRedOp_t get() const { return op_; }

  template <typename ContextFn>
  void Destroy(Clock::time_point deadline, std::chrono::milliseconds timeout,
               ContextFn&& context) {
    if (!created_) return;
    created_ = false;
    FinishNcclCall(comm_, ncclRedOpDestroy(op_, comm_.raw()), "ncclRedOpDestroy", deadline,
                   timeout, context);
  }

 private:
  NcclComm& comm_;
  ncclRedOp_t op_ = ncclSum;
  bool created_ = false;
};

// What an enqueue function gets: the communicator, the communication stream, the deadline of
// the enqueue and the error context.
struct Enqueue {
  NcclComm& comm;
  ncclComm_t raw;
  cudaStream_t stream;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout;
  const ContextFn& context;

  void Finish(ncclResult_t result, const char* call) const {
    FinishNcclCall(comm, result, call, deadline, timeout, context);
  }
};

// Issues one collective the ProcessGroupNCCL way (collective() in ProcessGroupNCCL.cpp):
// the communication stream waits on the caller's current stream, `enqueue` issues the NCCL
// call(s) on it, and the completion event is recorded after them. `stash` is kept alive
// until the event completes. A synchronous call (info.async_op false) waits before returning.
template <typename EnqueueFn>
std::shared_ptr<Work> Launch(State& s, const CollectiveInfo& info, std::vector<Tensor> stash,
                             EnqueueFn&& enqueue) {
  const ContextFn context = [&] { return "[" + info.str() + "] " + s.Describe(); };
  DeviceGuard guard(s.device.index, context);
  s.CollectCompleted();
  s.CheckUsable(info);
  const cudaStream_t caller = CurrentCudaStream(s.device).handle;
  FSDP_CUDA_CHECK(cudaEventRecord(s.sync_event, caller), context());
  FSDP_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.sync_event, 0), context());
  auto work = std::make_shared<NcclWork>(info.str(), s.options.timeout, s.comm, s.device.index,
                                         std::move(stash));
  const Enqueue e{*s.comm, s.comm->raw(), s.stream, Clock::now() + s.options.timeout,
                  s.options.timeout, context};
  enqueue(e);
  work->RecordEnd(s.stream, context);
  s.inflight.push_back(work);
  if (!info.async_op) work->wait(s.options.timeout);
  return work;
}

// A no-op collective (every rank's payload is empty): nothing to order or wait for.
std::shared_ptr<Work> EmptyOp(const State& s, const CollectiveInfo& info) {
  s.CheckUsable(info);
  return std::make_shared<CompletedWork>(info.str(), s.options.timeout);
}

size_t Count(const Tensor& t) { return static_cast<size_t>(t.numel()); }

}  // namespace

// ---- NcclProcessGroup -----------------------------------------------------------------------

NcclProcessGroup::NcclProcessGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
NcclProcessGroup::~NcclProcessGroup() = default;

std::shared_ptr<NcclProcessGroup> NcclProcessGroup::Create(std::shared_ptr<Store> store,
                                                           int rank, int world_size, Device device,
                                                           NcclOptions options) {
  FSDP_CHECK(store != nullptr, "NcclProcessGroup::Create: null store");
  FSDP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "NcclProcessGroup::Create: rank ",
             rank, " out of range for world size ", world_size);
  FSDP_CHECK(options.timeout.count() > 0, "NcclProcessGroup::Create: timeout must be positive, got ",
             Ms(options.timeout));
  FSDP_CHECK(device.is_cuda(), "NcclProcessGroup::Create (rank ", rank, "/", world_size,
             "): device ", device.str(),
             " is not a CUDA device; NCCL needs one GPU per rank (e.g. cuda:LOCAL_RANK)");
  const int visible = CudaDeviceCount();
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, visible > 0, "NcclProcessGroup::Create (rank ", rank,
                  "/", world_size, ", ", device.str(), "): no CUDA device visible");
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, device.index >= 0 && device.index < visible,
                  "NcclProcessGroup::Create (rank ", rank, "/", world_size, "): ", device.str(),
                  " is not visible (", visible, " CUDA device(s) visible)");

  auto s = std::make_unique<State>();
  s->store = std::move(store);
  s->options = std::move(options);
  s->rank = rank;
  s->size = world_size;
  for (int r = 0; r < world_size; ++r) s->global_ranks.push_back(r);
  s->name = "0";
  s->device = device;
  const std::string context = "NcclProcessGroup::Create: " + s->Describe();

  DeviceGuard guard(device.index, [&] { return std::string(context); });
  // Rendezvous: rank 0 publishes the unique id, the others read it (ProcessGroupNCCL's
  // broadcastUniqueNCCLID through the store).
  const std::string key = nccl_internal::UniqueIdStoreKey(s->options.prefix, s->name);
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) ThrowNcclError(r, "ncclGetUniqueId", context, nullptr);
    s->store->set(key, nccl_internal::EncodeUniqueId(id));
  } else {
    id = nccl_internal::DecodeUniqueId(s->store->get(key, s->options.timeout), key);
  }

  // Nonblocking, so that a stuck init, collective or finalize can be abandoned with
  // ncclCommAbort (ProcessGroupNCCL with TORCH_NCCL_USE_COMM_NONBLOCKING).
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = s->name.c_str();
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  // A nonblocking init may still be running when the call returns: wait until it is ready.
  if (r == ncclSuccess || r == ncclInProgress) {
    r = PollInProgress({comm}, Clock::now() + s->options.timeout);
  }
  if (r != ncclSuccess) {
    const std::string last = NcclLastError(comm);
    if (comm != nullptr) ncclCommAbort(comm);
    if (r == ncclInProgress) {
      FSDP_THROW(ErrorCode::kDeadlineExceeded, context,
                 ": ncclCommInitRankConfig did not finish within ", Ms(s->options.timeout),
                 " (are all ", world_size, " ranks running, each on its own GPU?); aborted");
    }
    FSDP_THROW(NcclErrorCode(r), context, ": ",
               FormatNcclError("ncclCommInitRankConfig", r, last));
  }
  s->comm = std::make_shared<NcclComm>(comm, device.index, s->name);
  s->CreateStreamAndEvent();
  return std::shared_ptr<NcclProcessGroup>(new NcclProcessGroup(std::move(s)));
}

int NcclProcessGroup::rank() const { return state_->rank; }
int NcclProcessGroup::size() const { return state_->size; }
std::vector<int> NcclProcessGroup::global_ranks() const { return state_->global_ranks; }
std::chrono::milliseconds NcclProcessGroup::timeout() const { return state_->options.timeout; }
std::string NcclProcessGroup::group_name() const { return state_->name; }
Device NcclProcessGroup::device() const { return state_->device; }

void NcclProcessGroup::abort(const std::string& reason) { state_->comm->Abort(reason); }
bool NcclProcessGroup::is_aborted() const { return state_->comm->aborted(); }

std::shared_ptr<Work> NcclProcessGroup::all_gather_into_tensor_impl(const Tensor& output,
                                                                    const Tensor& input,
                                                                    const CollectiveInfo& info) {
  State& s = *state_;
  s.CheckTensor(output, "output", info);
  s.CheckTensor(input, "input", info);
  if (input.numel() == 0) return EmptyOp(s, info);
  const ncclDataType_t type = nccl_internal::ToNcclDataType(input.dtype());
  return Launch(s, info, {output, input}, [&](const Enqueue& e) {
    // In place when input is output's chunk rank(), which NCCL supports as such.
    e.Finish(ncclAllGather(input.data_ptr(), output.data_ptr(), Count(input), type, e.raw,
                           e.stream),
             "ncclAllGather");
  });
}

std::shared_ptr<Work> NcclProcessGroup::reduce_scatter_tensor_impl(const Tensor& output,
                                                                   const Tensor& input,
                                                                   const ReduceOptions& options,
                                                                   const CollectiveInfo& info) {
  State& s = *state_;
  s.CheckTensor(output, "output", info);
  s.CheckTensor(input, "input", info);
  if (output.numel() == 0) return EmptyOp(s, info);
  const ncclDataType_t type = nccl_internal::ToNcclDataType(input.dtype());
  return Launch(s, info, {output, input}, [&](const Enqueue& e) {
    ScopedRedOp op(e.comm, options, input.dtype(), e.deadline, e.timeout, e.context);
    e.Finish(ncclReduceScatter(input.data_ptr(), output.data_ptr(), Count(output), type, op.get(),
                               e.raw, e.stream),
             "ncclReduceScatter");
    op.Destroy(e.deadline, e.timeout, e.context);
  });
}

std::shared_ptr<Work> NcclProcessGroup::all_reduce_impl(const Tensor& tensor,
                                                        const ReduceOptions& options,
                                                        const CollectiveInfo& info) {
  State& s = *state_;
  s.CheckTensor(tensor, "tensor", info);
  if (tensor.numel() == 0) return EmptyOp(s, info);
  const ncclDataType_t type = nccl_internal::ToNcclDataType(tensor.dtype());
  return Launch(s, info, {tensor}, [&](const Enqueue& e) {
    ScopedRedOp op(e.comm, options, tensor.dtype(), e.deadline, e.timeout, e.context);
    e.Finish(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), Count(tensor), type, op.get(),
                           e.raw, e.stream),
             "ncclAllReduce");
    op.Destroy(e.deadline, e.timeout, e.context);
  });
}

std::shared_ptr<Work> NcclProcessGroup::broadcast_impl(const Tensor& tensor, int root,
                                                       const CollectiveInfo& info) {
  State& s = *state_;
  s.CheckTensor(tensor, "tensor", info);
  if (tensor.numel() == 0) return EmptyOp(s, info);
  const ncclDataType_t type = nccl_internal::ToNcclDataType(tensor.dtype());
  return Launch(s, info, {tensor}, [&](const Enqueue& e) {
    e.Finish(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), Count(tensor), type, root, e.raw,
                           e.stream),
             "ncclBroadcast");
  });
}

std::shared_ptr<Work> NcclProcessGroup::all_gather_impl(const std::vector<Tensor>& outputs,
                                                        const Tensor& input,
                                                        const CollectiveInfo& info) {
  State& s = *state_;
  s.CheckTensor(input, "input", info);
  bool any = false;
  for (size_t r = 0; r < outputs.size(); ++r) {
    s.CheckTensor(outputs[r], "outputs[" + std::to_string(r) + "]", info);
    any = any || outputs[r].numel() > 0;
  }
  if (!any) return EmptyOp(s, info);
  const ncclDataType_t type = nccl_internal::ToNcclDataType(input.dtype());
  std::vector<Tensor> stash = outputs;
  stash.push_back(input);
  // As ProcessGroupNCCL::allgather does for outputs of different sizes: one broadcast per
  // rank in a group (rank r's input to every outputs[r]). It serves equal sizes as well, and
  // writes the outputs directly instead of through a flat staging buffer.
  return Launch(s, info, std::move(stash), [&](const Enqueue& e) {
    const ncclResult_t start = ncclGroupStart();
    if (start != ncclSuccess) ThrowNcclError(start, "ncclGroupStart", e.context(), e.raw);
    ncclResult_t first_error = ncclSuccess;
    const char* failed_call = "ncclGroupEnd";
    for (int r = 0; r < static_cast<int>(outputs.size()) && first_error == ncclSuccess; ++r) {
      const Tensor& out = outputs[static_cast<size_t>(r)];
      if (out.numel() == 0) continue;
      const void* send = r == s.rank ? input.data_ptr() : out.data_ptr();
      const ncclResult_t b =
          ncclBroadcast(send, out.data_ptr(), Count(out), type, r, e.raw, e.stream);
      if (b != ncclSuccess && b != ncclInProgress) {
        first_error = b;
        failed_call = "ncclBroadcast";
      }
    }
    const ncclResult_t end = ncclGroupEnd();  // always close the group
    e.Finish(first_error != ncclSuccess ? first_error : end, failed_call);
  });
}

void NcclProcessGroup::barrier_impl(const CollectiveInfo& info) {
  // ProcessGroupNCCL::barrier: an all-reduce of one element on this rank's device, waited on
  // by the host (info.async_op is false, so Launch waits with the group's deadline).
  State& s = *state_;
  if (s.barrier_buffer == nullptr) {
    const ContextFn context = [&] { return "[" + info.str() + "] " + s.Describe(); };
    DeviceGuard guard(s.device.index, context);
    FSDP_CUDA_CHECK(cudaMalloc(&s.barrier_buffer, sizeof(float)), context());
    FSDP_CUDA_CHECK(cudaMemset(s.barrier_buffer, 0, sizeof(float)), context());
  }
  Launch(s, info, {}, [&](const Enqueue& e) {
    e.Finish(ncclAllReduce(s.barrier_buffer, s.barrier_buffer, 1, ncclFloat32, ncclSum, e.raw,
                           e.stream),
             "ncclAllReduce (barrier)");
  });
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::new_group_impl(const std::vector<int>& ranks,
                                                               const CollectiveInfo& info) {
  State& s = *state_;
  const ContextFn context = [&] { return "[" + info.str() + "] " + s.Describe(); };
  s.CheckUsable(info);
  // Every rank of this group calls new_group, so every rank numbers subgroups alike.
  const std::string index = std::to_string(++s.subgroups_created);
  const std::string name = s.name == "0" ? index : s.name + "." + index;
  const int me = s.global_ranks[static_cast<size_t>(s.rank)];
  const auto it = std::find(ranks.begin(), ranks.end(), me);
  const bool member = it != ranks.end();
  const int position = member ? static_cast<int>(it - ranks.begin()) : 0;

  DeviceGuard guard(s.device.index, context);
  s.CollectCompleted();
  // ncclCommSplit is collective over the parent: members pass color 0 and their position as
  // key (ranks follow ascending global rank), non-members NCCL_SPLIT_NOCOLOR.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name.c_str();
  ncclComm_t parent = s.comm->raw();
  ncclComm_t child = nullptr;
  ncclResult_t r = ncclCommSplit(parent, member ? 0 : NCCL_SPLIT_NOCOLOR, position, &child,
                                 &config);
  if (r == ncclSuccess || r == ncclInProgress) {
    r = PollInProgress({parent, child}, Clock::now() + s.options.timeout);
  }
  if (r != ncclSuccess) {
    const std::string last = NcclLastError(child != nullptr ? child : parent);
    if (child != nullptr) ncclCommAbort(child);
    const std::string what = r == ncclInProgress
                                 ? "ncclCommSplit did not finish within " + Ms(s.options.timeout)
                                 : FormatNcclError("ncclCommSplit", r, last);
    s.comm->Abort(what);
    FSDP_THROW(r == ncclInProgress ? ErrorCode::kDeadlineExceeded : NcclErrorCode(r), context(),
               ": creating subgroup ", name, ": ", what,
               "; the parent communicator was aborted (ncclCommAbort)");
  }
  if (!member) {
    if (child != nullptr) ncclCommAbort(child);  // NCCL returns none for NOCOLOR
    return nullptr;
  }
  FSDP_CHECK_CODE(ErrorCode::kInternal, child != nullptr, context(),
                  ": ncclCommSplit returned no communicator for member ", me);

  auto sub = std::make_unique<State>();
  sub->store = s.store;
  sub->options = s.options;
  sub->rank = position;
  sub->size = static_cast<int>(ranks.size());
  sub->global_ranks = ranks;
  sub->name = name;
  sub->device = s.device;
  sub->comm = std::make_shared<NcclComm>(child, s.device.index, name);
  sub->CreateStreamAndEvent();
  return std::shared_ptr<NcclProcessGroup>(new NcclProcessGroup(std::move(sub)));
}

}  // namespace fsdp::distributed
