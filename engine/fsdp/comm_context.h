// CommContext: the communication state shared by every FSDP state and parameter group under
// one root (PyTorch's FSDPCommContext): the all-gather copy-in / all-gather / reduce-scatter /
// all-reduce streams, the all-gather result kept alive until the next group's copy-out
// ([Note: implicit forward prefetch] in docs/fsdp.md), the last reduce-scatter state, and the
// post-forward order used by the default backward prefetch.
//
// Streams and events (docs/fsdp-behaviour.md, "Streams and the implicit forward prefetch"): on
// a CUDA device the context owns four
// dedicated non-blocking CUDA streams (high priority, as FSDP2) and CommStream / CommEvent wrap
// CudaStream / CudaEvent: the all-gather copy-in runs on the copy-in stream, the collective on
// the all-gather stream, the copy-out on the current stream after waiting for the all-gather's
// event; the reduce-scatter (and HSDP all-reduce) on their streams after waiting for the
// current stream. Buffers handed between streams are kept alive by the states below until
// their consumer has waited on the matching event (no record_stream). On the CPU (and with a
// context never lazily initialised) work is ordered by the issuing thread, so every stream is
// a named no-op that keeps FSDP2's structure (which stream waits on which) in the code.
//
// Ownership: created by a parameter group (its own, before lazy init) and replaced at the
// root's lazy init by the root's, shared (std::shared_ptr) by all states and groups of the
// tree. post_forward_order holds non-owning pointers to groups owned by the states.
// Thread-safety: used by its rank's thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/cuda_stream.h"
#include "engine/core/device.h"
#include "engine/core/tensor.h"
#include "engine/fsdp/training_state.h"

namespace fsdp::fsdp2 {

class FsdpParamGroup;
struct AllGatherResult;

class CommStream;

// A log of FSDP's stream synchronisation on one rank thread, by stream name: which stream
// recorded which event, waited on which event or stream, and which stream guards were entered.
// CommStream, CommEvent and CommStreamGuard append to the trace installed on the calling
// thread (StreamTraceScope) whether or not their streams are CUDA streams, so the CPU path
// shows exactly the ordering the CUDA path enforces (tests check FSDP2's event contract with
// it, and a user debugging a GPU race can print it). A stream named "current" is logged under
// the name of the innermost guarded stream, which is what it resolves to on a GPU.
// The FSDP collectives also log where their work is issued (TraceWork: the all-gather copy-in,
// the all-gather, the copy-out, the reduce-scatter copy-in, the reduce-scatter, the HSDP
// all-reduce and the post-reduce gradient writes), so that a reader can tell which data each
// wait orders (the conformance family fully_shard_overlap judges FSDP2's happens-before
// relations from it).
// Thread-safety: one trace per thread; not shared.
struct StreamOp {
  enum class Kind { kRecord, kWaitEvent, kWaitStream, kEnterGuard, kExitGuard, kWork };
  Kind kind;
  std::string stream;  // the stream that records, waits, is guarded or runs the work
  std::string other;   // kWaitStream: the producer stream; kWork: what runs (TraceWork)
  int64_t event = 0;   // kRecord / kWaitEvent: the event's id; kWork: the event it reads, if any
  std::string str() const;  // "all_gather.record(e3)", "current.wait_event(e3)", ...
};

class StreamTrace {
 public:
  const std::vector<StreamOp>& ops() const { return ops_; }
  std::string str() const;  // one op per line
  void append(StreamOp op);

 private:
  // The name a stream is logged under (resolves "current" through the guard stack).
  std::string resolve(const std::string& stream) const;

  std::vector<StreamOp> ops_;
  std::vector<std::string> guards_;
};

// RAII: installs `trace` for the calling thread (nesting restores the previous one).
class StreamTraceScope {
 public:
  explicit StreamTraceScope(StreamTrace* trace);
  ~StreamTraceScope();
  StreamTraceScope(const StreamTraceScope&) = delete;
  StreamTraceScope& operator=(const StreamTraceScope&) = delete;

 private:
  StreamTrace* previous_;
};

// Logs `work` as issued now on the calling thread's current stream (the innermost guarded
// stream, "current" when none), e.g. "all_gather_copy_in"; `event` names an event whose
// producer's output the work reads (the copy-out: its all-gather's event), 0 when none. A
// no-op without an installed trace.
void TraceWork(std::string_view work, int64_t event = 0);

// A recorded point in a stream (PyTorch's `stream.record_event()`). On a CUDA stream it holds
// a CudaEvent recorded there; on a CPU stream it is complete when recorded. Copies share the
// underlying event (the states below copy it).
// Thread-safety: used by its rank's thread only.
class CommEvent {
 public:
  // Records the work issued so far on `stream`; replaces an earlier record.
  void record(const CommStream& stream);
  // Blocks the calling thread until the recorded work finished (CPU: returns at once).
  void synchronize() const;
  bool recorded() const { return recorded_; }
  // A number unique in the process per record (what a StreamTrace calls the event).
  int64_t id() const { return id_; }
  // The CUDA event, or null when recorded on a CPU stream (or never recorded).
  const CudaEvent* cuda_event() const { return cuda_event_.get(); }

 private:
  bool recorded_ = false;
  int64_t id_ = 0;
  std::shared_ptr<CudaEvent> cuda_event_;
};

// A named execution stream. Three kinds:
//  * CPU (the default constructor, or any stream of a CPU device): the issuing thread; every
//    wait is a no-op and nothing calls the CUDA runtime;
//  * Current(cuda:N): the calling thread's current stream of the device, resolved at each use
//    (CurrentCudaStream, i.e. the innermost CudaStreamGuard or the default stream);
//  * Dedicated(name, cuda:N): an owned non-blocking CudaStream (shared by copies).
// Thread-safety: used by its rank's thread only (the CUDA stream itself is thread-safe).
class CommStream {
 public:
  explicit CommStream(std::string name = "current") : name_(std::move(name)) {}
  // The current stream of `device` (a no-op CPU stream for a CPU device).
  static CommStream Current(Device device);
  // A new dedicated stream on `device` with cudaStreamCreateWithPriority's `priority` (a no-op
  // CPU stream for a CPU device). Throws Unavailable when CUDA or the device is unavailable.
  static CommStream Dedicated(std::string name, Device device, int priority = -1);

  const std::string& name() const { return name_; }
  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  bool is_dedicated() const { return stream_ != nullptr; }
  // The CUDA stream this names now (requires is_cuda()).
  CudaStreamRef ref() const;

  // Future work on this stream waits for the work issued so far on `other` (no host block).
  // A no-op unless both are CUDA streams of one device and differ.
  void wait_stream(const CommStream& other) const;
  // Future work on this stream waits for `event` (no-op for a CPU stream or a CPU event).
  void wait_event(const CommEvent& event) const;
  // record_event(): a new event recorded on this stream now.
  CommEvent record_event() const;

 private:
  std::string name_;
  Device device_ = Device::CPU();
  std::shared_ptr<CudaStream> stream_;  // Dedicated only
};

// RAII: makes a CUDA CommStream the current stream of its device for the scope (kernels,
// copies and the process group's host staging then issue on it); does nothing for a CPU
// stream (PyTorch's `with device_handle.stream(stream):`). Not movable; destroy on the thread
// that created it.
class CommStreamGuard {
 public:
  explicit CommStreamGuard(const CommStream& stream);
  ~CommStreamGuard();
  CommStreamGuard(const CommStreamGuard&) = delete;
  CommStreamGuard& operator=(const CommStreamGuard&) = delete;

 private:
  std::optional<CudaStreamGuard> guard_;
  std::optional<std::string> traced_name_;  // set when the enter went to a StreamTrace
};

// An all-gather result whose buffer must stay alive until `event` (the copy-out) is waited.
struct AllGatherState {
  std::shared_ptr<AllGatherResult> all_gather_result;
  CommEvent event;
};

// The last reduce-scatter's input (kept alive until the next reduce-scatter or the end of
// backward) and its completion event.
struct ReduceScatterState {
  Tensor reduce_scatter_input;
  CommEvent event;
};

class CommContext {
 public:
  CommContext();

  // Sets the device and, for a CUDA device, creates the four dedicated streams (idempotent).
  void lazy_init(Device device);
  bool initialized() const { return initialized_; }
  Device device() const { return device_; }

  CommStream& current_stream() { return current_stream_; }
  CommStream& all_gather_copy_in_stream() { return all_gather_copy_in_stream_; }
  CommStream& all_gather_stream() { return all_gather_stream_; }
  CommStream& reduce_scatter_stream() { return reduce_scatter_stream_; }
  CommStream& all_reduce_stream() { return all_reduce_stream_; }
  // (copy-in stream, all-gather stream): the dedicated streams for a synchronous unshard in
  // FORWARD / PRE_BACKWARD (implicit prefetch), else the current stream for both.
  std::pair<CommStream*, CommStream*> get_all_gather_streams(bool async_op,
                                                            TrainingState training_state);
  // Both all-gather streams wait for `event` (FSDP2's _wait_all_gather_streams_on_event).
  void wait_all_gather_streams_on_event(const CommEvent& event);

  // Post-forward order: one entry per group use, appended at each post-forward.
  std::vector<FsdpParamGroup*> post_forward_order;
  std::optional<AllGatherState> all_gather_state;
  std::optional<ReduceScatterState> reduce_scatter_state;

 private:
  bool initialized_ = false;
  Device device_;
  CommStream current_stream_{"current"};
  CommStream all_gather_copy_in_stream_{"all_gather_copy_in"};
  CommStream all_gather_stream_{"all_gather"};
  CommStream reduce_scatter_stream_{"reduce_scatter"};
  CommStream all_reduce_stream_{"all_reduce"};
};

}  // namespace fsdp::fsdp2
