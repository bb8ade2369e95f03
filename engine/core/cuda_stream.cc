#include "engine/core/cuda_stream.h"

#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "fsdp/config.h"

#if FSDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fsdp {

namespace {

// The current stream of each device index on this thread (nullptr: the default stream).
std::vector<CudaStreamHandle>& CurrentStreams() {
  thread_local std::vector<CudaStreamHandle> streams;
  return streams;
}

void CheckCudaDevice(Device device, const char* what) {
  FSDP_CHECK(device.is_cuda() && device.index >= 0, what, ": expected a CUDA device, got ", device.str());
}

#if FSDP_HAVE_CUDA
void Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  FSDP_THROW(ErrorCode::kUnavailable, what, " failed: ", cudaGetErrorName(err), " (",
             cudaGetErrorString(err), ")");
}

// Makes `index` the calling thread's CUDA device for the duration of a scope.
class DeviceScope {
 public:
  explicit DeviceScope(int index) {
    Check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != index) Check(cudaSetDevice(index), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};
#else
[[noreturn]] void NoCuda(const char* what) {
  FSDP_THROW(ErrorCode::kUnavailable, what,
             ": this build has no CUDA support (configured without nvcc or with FSDP_ENABLE_CUDA=OFF)");
}
#endif

}  // namespace

// ---- CudaStreamRef ---------------------------------------------------------------------------

void CudaStreamRef::Synchronize() const {
#if FSDP_HAVE_CUDA
  DeviceScope scope(device_index);
  Check(cudaStreamSynchronize(handle), "cudaStreamSynchronize");
#else
  NoCuda("CudaStreamRef::Synchronize");
#endif
}

bool CudaStreamRef::Query() const {
#if FSDP_HAVE_CUDA
  DeviceScope scope(device_index);
  const cudaError_t err = cudaStreamQuery(handle);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  Check(err, "cudaStreamQuery");
  return true;
#else
  NoCuda("CudaStreamRef::Query");
#endif
}

// ---- CudaStream ------------------------------------------------------------------------------

CudaStream::CudaStream(Device device, int priority) : device_index_(device.index) {
  CheckCudaDevice(device, "CudaStream");
#if FSDP_HAVE_CUDA
  DeviceScope scope(device_index_);
  cudaStream_t s = nullptr;
  Check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority), "cudaStreamCreateWithPriority");
  handle_ = s;
#else
  (void)priority;
  NoCuda("CudaStream");
#endif
}

CudaStream::~CudaStream() { Destroy(); }

CudaStream::CudaStream(CudaStream&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_index_(other.device_index_) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Destroy();
    handle_ = std::exchange(other.handle_, nullptr);
    device_index_ = other.device_index_;
  }
  return *this;
}

void CudaStream::Destroy() noexcept {
#if FSDP_HAVE_CUDA
  if (handle_ != nullptr) {
    // cudaStreamDestroy returns at once; queued work still completes.
    cudaStreamDestroy(handle_);
    handle_ = nullptr;
  }
#endif
}

// ---- CudaEvent -------------------------------------------------------------------------------

CudaEvent::~CudaEvent() { Destroy(); }

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : enable_timing_(other.enable_timing_),
      handle_(std::exchange(other.handle_, nullptr)),
      device_index_(std::exchange(other.device_index_, -1)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    Destroy();
    enable_timing_ = other.enable_timing_;
    handle_ = std::exchange(other.handle_, nullptr);
    device_index_ = std::exchange(other.device_index_, -1);
  }
  return *this;
}

void CudaEvent::Destroy() noexcept {
#if FSDP_HAVE_CUDA
  if (handle_ != nullptr) {
    cudaEventDestroy(handle_);
    handle_ = nullptr;
  }
#endif
}

void CudaEvent::Record(Device device) { Record(CurrentCudaStream(device)); }

void CudaEvent::Record(CudaStreamRef stream) {
  FSDP_CHECK(device_index_ < 0 || device_index_ == stream.device_index, "CudaEvent::Record: event of cuda:",
             device_index_, " recorded on a stream of cuda:", stream.device_index);
#if FSDP_HAVE_CUDA
  DeviceScope scope(stream.device_index);
  if (handle_ == nullptr) {
    cudaEvent_t e = nullptr;
    Check(cudaEventCreateWithFlags(&e, enable_timing_ ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    handle_ = e;
    device_index_ = stream.device_index;
  }
  Check(cudaEventRecord(handle_, stream.handle), "cudaEventRecord");
#else
  NoCuda("CudaEvent::Record");
#endif
}

void CudaEvent::Wait(CudaStreamRef stream) const {
  if (handle_ == nullptr) return;
#if FSDP_HAVE_CUDA
  DeviceScope scope(stream.device_index);
  Check(cudaStreamWaitEvent(stream.handle, handle_, 0), "cudaStreamWaitEvent");
#else
  (void)stream;
#endif
}

bool CudaEvent::Query() const {
  if (handle_ == nullptr) return true;
#if FSDP_HAVE_CUDA
  const cudaError_t err = cudaEventQuery(handle_);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  Check(err, "cudaEventQuery");
#endif
  return true;
}

void CudaEvent::Synchronize() const {
  if (handle_ == nullptr) return;
#if FSDP_HAVE_CUDA
  Check(cudaEventSynchronize(handle_), "cudaEventSynchronize");
#endif
}

float CudaEvent::ElapsedMs(const CudaEvent& end) const {
  FSDP_CHECK(enable_timing_ && end.enable_timing_,
             "CudaEvent::ElapsedMs: both events must be created with enable_timing=true");
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, handle_ != nullptr && end.handle_ != nullptr,
                  "CudaEvent::ElapsedMs: both events must be recorded before measuring elapsed time");
#if FSDP_HAVE_CUDA
  float ms = 0.0f;
  Check(cudaEventElapsedTime(&ms, handle_, end.handle_), "cudaEventElapsedTime");
  return ms;
#else
  NoCuda("CudaEvent::ElapsedMs");
#endif
}

// ---- Current stream --------------------------------------------------------------------------

CudaStreamRef CurrentCudaStream(Device device) {
  CheckCudaDevice(device, "CurrentCudaStream");
  const auto& streams = CurrentStreams();
  const size_t i = static_cast<size_t>(device.index);
  return {i < streams.size() ? streams[i] : nullptr, device.index};
}

void SetCurrentCudaStream(CudaStreamRef stream) {
  FSDP_CHECK(stream.device_index >= 0, "SetCurrentCudaStream: negative device index ", stream.device_index);
  auto& streams = CurrentStreams();
  const size_t i = static_cast<size_t>(stream.device_index);
  if (i >= streams.size()) streams.resize(i + 1, nullptr);
  streams[i] = stream.handle;
}

CudaStreamGuard::CudaStreamGuard(CudaStreamRef stream) : previous_(CurrentCudaStream(stream.device())) {
  SetCurrentCudaStream(stream);
}

// The constructor sized the thread's table for this device, so restoring cannot throw.
CudaStreamGuard::~CudaStreamGuard() { CurrentStreams()[static_cast<size_t>(previous_.device_index)] = previous_.handle; }

}  // namespace fsdp
