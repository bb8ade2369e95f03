// CUDA streams and events, and the per-thread "current stream" that kernels launch on
// (PyTorch's c10::cuda::CUDAStream / CUDAEvent / getCurrentCUDAStream / CUDAStreamGuard).
//
// This header does not include the CUDA runtime: the raw handles are the runtime's opaque
// types (`cudaStream_t` is `CUstream_st*`, `cudaEvent_t` is `CUevent_st*`), declared here so
// that CPU-only code and CPU-only builds can name them. In a build without CUDA every
// operation that would need the runtime throws Unavailable; CurrentCudaStream still returns
// the default stream (a null handle) so callers need no #if.
//
// The default current stream of every device is the legacy default stream (handle nullptr),
// which orders itself with every blocking stream. Streams created by CudaStream are
// non-blocking: they do NOT synchronise implicitly with the default stream, so work handed
// between streams must be ordered with CudaEvent (record on the producer, wait on the
// consumer), exactly as in PyTorch.
#pragma once

#include <cstdint>

#include "engine/core/device.h"

struct CUstream_st;
struct CUevent_st;

namespace fsdp {

using CudaStreamHandle = CUstream_st*;  // == cudaStream_t
using CudaEventHandle = CUevent_st*;    // == cudaEvent_t

// A non-owning reference to a stream of one device (a value type, cheap to copy).
// handle == nullptr is the device's legacy default stream.
// Thread-safety: a value; the stream it names may be used from any thread.
struct CudaStreamRef {
  CudaStreamHandle handle = nullptr;
  int device_index = 0;

  bool is_default() const { return handle == nullptr; }
  Device device() const { return Device::CUDA(device_index); }
  // Blocks the calling thread until all work queued on the stream has finished.
  void Synchronize() const;
  // True when all work queued on the stream has finished (cudaStreamQuery).
  bool Query() const;
};

// An owned, non-blocking stream (cudaStreamCreateWithFlags(cudaStreamNonBlocking)) on one
// device, destroyed with the object. Move-only.
// Thread-safety: the stream may be used from several threads (the runtime is thread-safe);
// the object itself must not be moved or destroyed while another thread uses it.
class CudaStream {
 public:
  // Creates a stream on `device` (which must be a CUDA device). `priority` follows
  // cudaStreamCreateWithPriority (lower numbers are higher priority; 0 is the default).
  explicit CudaStream(Device device, int priority = 0);
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  CudaStreamRef ref() const { return {handle_, device_index_}; }
  CudaStreamHandle handle() const { return handle_; }
  Device device() const { return Device::CUDA(device_index_); }
  void Synchronize() const { ref().Synchronize(); }
  bool Query() const { return ref().Query(); }

 private:
  void Destroy() noexcept;
  CudaStreamHandle handle_ = nullptr;
  int device_index_ = 0;
};

// An owned CUDA event, created lazily on first Record (like at::cuda::CUDAEvent), so an
// event can be declared before its device is known. Move-only.
// Thread-safety: Record/Wait/Query/Synchronize on one event must not race with each other
// (one producer records; consumers wait after the record is published by the caller).
class CudaEvent {
 public:
  // enable_timing: needed for ElapsedMs (timing events are slower; off by default, as
  // cudaEventDisableTiming in PyTorch).
  explicit CudaEvent(bool enable_timing = false) : enable_timing_(enable_timing) {}
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Records the event on `stream` (its device must match the device of earlier records).
  void Record(CudaStreamRef stream);
  // Records on the current stream of `device`.
  void Record(Device device);
  // Makes future work on `stream` wait for the recorded work (no host blocking). A no-op when
  // the event was never recorded, like PyTorch.
  void Wait(CudaStreamRef stream) const;
  // True when the recorded work has completed (or nothing was recorded).
  bool Query() const;
  // Blocks the calling thread until the recorded work has completed.
  void Synchronize() const;
  // Milliseconds between this event's record and `end`'s; both need enable_timing and must
  // have completed.
  float ElapsedMs(const CudaEvent& end) const;

  bool was_recorded() const { return handle_ != nullptr; }
  CudaEventHandle handle() const { return handle_; }
  int device_index() const { return device_index_; }

 private:
  void Destroy() noexcept;
  bool enable_timing_ = false;
  CudaEventHandle handle_ = nullptr;
  int device_index_ = -1;
};

// The calling thread's current stream for `device` (a CUDA device): the stream set by the
// innermost live CudaStreamGuard for that device on this thread, else the default stream.
// Every kernel, cuBLAS call and device copy of the engine is issued on it.
// Thread-safety: thread-local state; no locking.
CudaStreamRef CurrentCudaStream(Device device);
// Sets the calling thread's current stream for stream.device_index (prefer CudaStreamGuard).
void SetCurrentCudaStream(CudaStreamRef stream);

// RAII: makes `stream` the current stream of its device on this thread and restores the
// previous one on destruction (c10::cuda::CUDAStreamGuard). Not movable; must be destroyed
// on the thread that created it.
class CudaStreamGuard {
 public:
  explicit CudaStreamGuard(CudaStreamRef stream);
  ~CudaStreamGuard();
  CudaStreamGuard(const CudaStreamGuard&) = delete;
  CudaStreamGuard& operator=(const CudaStreamGuard&) = delete;

 private:
  CudaStreamRef previous_;
};

}  // namespace fsdp
