// CommContext: the communication state shared by every FSDP state and parameter group under
// one root (PyTorch's FSDPCommContext): the all-gather copy-in / all-gather / reduce-scatter /
// all-reduce streams, the all-gather result kept alive until the next group's copy-out
// ([Note: implicit forward prefetch] in docs/fsdp.md), the last reduce-scatter state, and the
// post-forward order used by the default backward prefetch.
//
// Streams and events: on the CPU (and with the synchronous threaded / Gloo process groups)
// work is ordered by the issuing thread, so CommStream and CommEvent are named no-op
// placeholders that keep FSDP2's structure (which stream waits on which) in the code; a CUDA
// backend replaces their bodies.
//
// Ownership: created by a parameter group (its own, before lazy init) and replaced at the
// root's lazy init by the root's, shared (std::shared_ptr) by all states and groups of the
// tree. post_forward_order holds non-owning pointers to groups owned by the states.
// Thread-safety: used by its rank's thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/tensor.h"
#include "engine/fsdp/training_state.h"

namespace fsdp::fsdp2 {

class FsdpParamGroup;
struct AllGatherResult;

// A recorded point in a stream. CPU: complete when recorded.
class CommEvent {
 public:
  void record() { recorded_ = true; }
  void synchronize() const {}
  bool recorded() const { return recorded_; }

 private:
  bool recorded_ = false;
};

// A named execution stream. CPU: the issuing thread; waits are no-ops.
class CommStream {
 public:
  explicit CommStream(std::string name = "current") : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  void wait_stream(const CommStream& /*other*/) const {}
  void wait_event(const CommEvent& /*event*/) const {}

 private:
  std::string name_;
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

  // Sets the device (idempotent).
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
