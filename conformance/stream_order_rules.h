// FSDP2's stream-order contract, judged from one rank's StreamOrderRecorder list
// (stream_order_recorder.h) by simulating CUDA stream semantics: every stream keeps a vector
// clock; work issued on a stream ticks it; record_event snapshots it; wait_event and
// wait_stream merge the producer's clock. Work A happens before work B when B's stream had
// merged A's tick by the time B was issued. Each rule names the happens-before relation that
// PyTorch's _fsdp_state.py / _fsdp_param_group.py / _fsdp_collectives.py establish and the data
// it protects (docs/fsdp-behaviour.md, "Streams and the implicit forward prefetch"):
//
//   events_recorded_before_waited   every waited event was recorded earlier on the rank
//   stream_guards_balanced          every stream guard entered is exited, innermost first
//   copy_in_after_optimizer_step    the root pre-forward orders both all-gather streams after
//                                   the current stream (or the post-optimizer event), so every
//                                   all-gather copy-in reads the parameters the optimizer wrote
//   copy_in_after_post_forward_reshard  an all-gather of post-forward shards (int
//                                   reshard_after_forward) runs after the reshard wrote them
//                                   (the group's reshard_after_forward_event)
//   all_gather_after_copy_in        all_gather_stream.wait_stream(all_gather_copy_in_stream)
//   copy_out_after_all_gather       the copy-out waits for its all-gather's event
//   all_gather_waited_before_release  by the end of each forward and backward the current
//                                   stream is ordered after every all-gather issued in it (its
//                                   copy-out, or for a prefetch nobody used, the end of backward
//                                   in FSDPParamGroup.finalize_backward), so no all-gather output
//                                   is freed while the collective may still write it
//   all_gather_buffer_released_after_copy_out  both all-gather streams are ordered after each
//                                   copy-out before the next copy-out (the implicit forward
//                                   prefetch keeps one all-gather result alive) and before the
//                                   pass ends, so that no later all-gather reuses a buffer still
//                                   being copied out
//   reduce_scatter_after_copy_in    reduce_scatter_stream.wait_stream(current_stream): the
//                                   reduce-scatter reads the gradients copied in on the current
//                                   stream
//   all_reduce_after_reduce_scatter the HSDP all-reduce reads the reduce-scatter output
//                                   (all_reduce_stream.wait_stream(reduce_scatter_stream))
//   reduce_scatter_input_released_after_reduce_scatter  the current stream waits for each
//                                   reduce-scatter before the next one's copy-in (which frees
//                                   the previous input) and before backward ends
//   optimizer_after_reduction       the root's end of backward makes the current stream wait for
//                                   every post-reduce event (the reduced gradient shards; the
//                                   all-reduce under HSDP) before the optimizer step
//   communication_on_dedicated_streams  copy-in, all-gather, reduce-scatter and all-reduce of
//                                   FORWARD / PRE_BACKWARD unshards and of post-backwards run on
//                                   their own streams (what overlaps communication with compute)
//   all_gather_streams_run_ahead    the all-gather streams wait for the whole current stream
//                                   only at the root pre-forward, and not at all when a
//                                   post-optimizer event was set
//
// Stateless functions; thread-safe.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace fsdp::conformance {

// What the rules need to know of the case beyond the trace.
struct StreamOrderFacts {
  // Modules (FQN, root "") whose post-forward reshard writes post-forward shards (an int
  // reshard_after_forward k with 1 < k < world on a module that reshards after forward).
  std::set<std::string> post_forward_mesh_modules;
  // Modules (FQN, root "") whose groups unshard with async_op=True (set_unshard_async_op):
  // their copy-ins and all-gathers run on the current stream (FSDPCommContext.
  // get_all_gather_streams), not on the all-gather streams.
  std::set<std::string> async_unshard_modules;
};

// The rule names above, in order.
const std::vector<std::string>& StreamOrderRuleNames();

// Rule name -> violations (empty: the rule holds) for one rank's list. A list that does not
// follow the recorder's format is reported under events_recorded_before_waited.
std::map<std::string, std::vector<std::string>> JudgeStreamOrder(const nlohmann::json& trace,
                                                                 const StreamOrderFacts& facts);

}  // namespace fsdp::conformance
