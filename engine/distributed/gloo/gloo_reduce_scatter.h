// The Gloo process group's reduce-scatter: a pipelined ring over Gloo UnboundBuffer send/recv,
// and the elementwise combine of two partial reductions that it shares with the all-reduce.
//
// [Note: pipelined ring reduce-scatter] A reduce-scatter is the first half of a ring all-reduce:
// in n-1 steps each rank sends one chunk to its right neighbour and combines the chunk that
// arrives from its left with its own input's chunk; after the last step rank r holds chunk r
// reduced over all ranks. Each chunk travels in segments (kRingSegmentBytes), and a segment is
// forwarded as soon as it is combined, so the wire, the reduction and the next step's receive
// overlap instead of alternating. Receives of the next step are posted before the current step
// is combined (two receive buffers, one per step parity), and the accumulators alternate too
// (an accumulator is reused only after its sends completed). Each step uses its own slot, so
// a segment can never match a receive of another step. The only working memory is a few chunk
// sized buffers (never a copy of the whole input), kept by the process group across calls in a
// RingReduceScatterWorkspace so that their pages are faulted in and registered once; the first
// send reads the caller's input in place when no conversion is needed. Partial results are
// combined as `local op received` exactly as the non-pipelined ring did, so results are
// unchanged.
//
// This is not Gloo's ReduceScatterHalvingDoubling, which pins the pair's TCP send buffer to the
// kernel minimum (docs/process_groups.md).
//
// Ownership: a workspace belongs to one process group (one Gloo context) and keeps its largest
// buffers until the group is destroyed, as PyTorch's caching allocator keeps freed blocks.
// Thread-safety: a call uses the context's pairs for its slots only; one collective at a time
// per context and workspace, like every Gloo collective.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/dtype.h"
#include "engine/distributed/reduce_op.h"

namespace fsdp::distributed {

// out[i] = a[i] op b[i] for SUM/AVG/PREMUL_SUM (a sum), MIN, MAX; `out` may alias `a` or `b`.
template <typename C>
void CombineElements(ReduceOp op, C* out, const C* a, const C* b, size_t n) {
  switch (op) {
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      break;
    default:
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      break;
  }
}

// Segment size of the pipelined ring ([Note: pipelined ring reduce-scatter]).
constexpr size_t kRingSegmentBytes = size_t{1024} << 10;

// Host buffers of the ring, registered with one Gloo context, grown on demand and reused.
class RingReduceScatterWorkspace {
 public:
  enum Role { kRecvEven, kRecvOdd, kAccEven, kAccOdd, kFirstSend, kRoles };
  explicit RingReduceScatterWorkspace(std::shared_ptr<::gloo::Context> context);
  ::gloo::Context& context() const { return *context_; }
  // The `role` buffer with at least `bytes` bytes (uninitialised), and its registration.
  char* Data(Role role, size_t bytes);
  ::gloo::transport::UnboundBuffer& Wire(Role role) { return *buffers_[role].wire; }

 private:
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t bytes = 0;
    std::unique_ptr<::gloo::transport::UnboundBuffer> wire;
  };
  std::shared_ptr<::gloo::Context> context_;
  Buffer buffers_[kRoles];
};

// Ring reduce-scatter of `input` (host, size * chunk elements of `dtype`, rank-major chunks)
// over the workspace's context. Writes chunk ctx.rank reduced over the ranks, in the compute
// type C (float for float32/float16/bfloat16, double, int64), into `result` (chunk elements; it may be the
// input's own chunk ctx.rank when the input is in the compute type); PREMUL_SUM inputs
// are scaled by options.premul_factor first. AVG's division is left to the caller (it is the
// sum here). `tag` names the collective (Gloo slot); `what` prefixes timeout errors.
// Throws Error(kDeadlineExceeded) when a peer does not answer within `timeout`.
template <typename C>
void RingReduceScatter(RingReduceScatterWorkspace& workspace, const char* input, DType dtype,
                       size_t chunk, const ReduceOptions& options, C* result, uint32_t tag,
                       std::chrono::milliseconds timeout, const std::string& what);

}  // namespace fsdp::distributed
