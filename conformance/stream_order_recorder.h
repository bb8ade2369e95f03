// StreamOrderRecorder: what a rank of the fully_shard_overlap family reports, the FSDP2
// stream trace (engine/fsdp/comm_context.h, StreamTrace) merged with the FSDP events
// (engine/fsdp/observer.h) and the body's phase marks, as one ordered list of entries:
//
//   {"op": "record" | "wait_event", "stream": s, "event": e}
//   {"op": "wait_stream", "stream": s, "other": producer}
//   {"op": "enter_stream" | "exit_stream", "stream": s}        a stream guard
//   {"op": "work", "stream": s, "what": w[, "event": e]}        FSDP work issued on s (w:
//       all_gather_copy_in, all_gather, all_gather_copy_out (e: the all-gather's event),
//       reduce_scatter_copy_in, reduce_scatter, all_reduce, post_reduce)
//   {"op": "fsdp_event", "what": kind, "module": fqn, "state": training state}
//   {"op": "phase", "what": forward | backward | optimizer_step | set_post_optim_event}
//
// Event ids are numbered 1, 2, ... in the order of their first appearance on the rank, so that
// equal runs report equal lists. Every stream op and work entry also carries "fsdp_op": the FSDP
// operation in progress when it was issued (the latest FSDP event or phase, e.g.
// "unshard layers.0 FORWARD"), so that a reader can tell which operation each belongs to.
//
// Usage: construct on the rank's thread before the model's first forward; call Phase() at each
// phase; Json() when done. Installs its trace (StreamTraceScope) and observer (ScopedObserver)
// for its lifetime. Not copyable; used by its rank's thread only.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/fsdp/comm_context.h"
#include "engine/fsdp/observer.h"

namespace fsdp::conformance {

class StreamOrderRecorder : public fsdp2::Observer {
 public:
  StreamOrderRecorder();
  StreamOrderRecorder(const StreamOrderRecorder&) = delete;
  StreamOrderRecorder& operator=(const StreamOrderRecorder&) = delete;

  // Marks the start of `phase` at this point of the trace.
  void Phase(const std::string& phase);
  // The merged list (see the file comment).
  nlohmann::json Json() const;

  void unshard(const std::string& fqn, fsdp2::TrainingState state) override;
  void reshard(const std::string& fqn, fsdp2::TrainingState state) override;
  void pre_backward(const std::string& fqn, fsdp2::TrainingState state) override;
  void post_backward(const std::string& fqn, fsdp2::TrainingState state) override;

 private:
  // An FSDP event or a phase, placed before trace op `index`.
  struct Mark {
    size_t index;
    nlohmann::json entry;
  };
  void AddEvent(const char* kind, const std::string& fqn, fsdp2::TrainingState state);

  fsdp2::StreamTrace trace_;
  fsdp2::StreamTraceScope trace_scope_;
  fsdp2::ScopedObserver observer_scope_;
  std::vector<Mark> marks_;
};

}  // namespace fsdp::conformance
