#include "engine/distributed/gloo/gloo_reduce_scatter.h"

#include <gloo/common/common.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine/core/error.h"

namespace fsdp::distributed {

namespace {

constexpr uint8_t kRingReduceScatterSlotPrefix = 0x50;  // beyond Gloo's own prefixes (1..8)

// A chunk-sized workspace buffer seen as C, and the number of sends it has in flight
// (drained before it is written again).
template <typename C>
struct RingBuffer {
  C* data = nullptr;
  ::gloo::transport::UnboundBuffer* wire = nullptr;
  int sends_in_flight = 0;

  RingBuffer(RingReduceScatterWorkspace& workspace, RingReduceScatterWorkspace::Role role,
             size_t chunk)
      : data(reinterpret_cast<C*>(workspace.Data(role, chunk * sizeof(C)))),
        wire(&workspace.Wire(role)) {}
};

}  // namespace

RingReduceScatterWorkspace::RingReduceScatterWorkspace(std::shared_ptr<::gloo::Context> context)
    : context_(std::move(context)) {}

char* RingReduceScatterWorkspace::Data(Role role, size_t bytes) {
  Buffer& b = buffers_[role];
  if (b.bytes < bytes || b.data == nullptr) {
    b.wire.reset();
    b.data.reset(new char[std::max<size_t>(bytes, 1)]);
    b.bytes = bytes;
    b.wire = context_->createUnboundBuffer(b.data.get(), std::max<size_t>(bytes, 1));
  }
  return b.data.get();
}

template <typename C>
void RingReduceScatter(RingReduceScatterWorkspace& workspace, const char* input, DType dtype,
                       size_t chunk, const ReduceOptions& options, C* result, uint32_t tag,
                       std::chrono::milliseconds timeout, const std::string& what) {
  ::gloo::Context& ctx = workspace.context();
  const int r = ctx.rank;
  const int n = ctx.size;
  const bool premul = options.op == ReduceOp::kPremulSum;
  const C factor = static_cast<C>(options.premul_factor);
  // The input is used in place when it is already in the compute type and needs no scaling.
  const bool direct = dtype == DTypeOf<C>::value && !premul;
  const C* input_c = reinterpret_cast<const C*>(input);
  const size_t segment = std::max<size_t>(1, kRingSegmentBytes / sizeof(C));
  const size_t segments = (chunk + segment - 1) / segment;
  auto seg_begin = [&](size_t k) { return k * segment; };
  auto seg_len = [&](size_t k) { return std::min(segment, chunk - k * segment); };

  // Segment k of this rank's input chunk `index` in the compute type (scaled for PREMUL_SUM),
  // written to `scratch` unless the input can be read in place.
  auto local = [&](int index, size_t k, C* scratch) -> const C* {
    const size_t offset = static_cast<size_t>(index) * chunk + seg_begin(k);
    if (direct) return input_c + offset;
    ConvertElements(input + offset * ElementSize(dtype), dtype, scratch, DTypeOf<C>::value,
                    seg_len(k));
    if (premul) {
      for (size_t i = 0; i < seg_len(k); ++i) scratch[i] *= factor;
    }
    return scratch;
  };

  std::vector<C> scratch(direct ? 0 : segment);
  if (n == 1) {
    for (size_t k = 0; k < segments; ++k) {
      const C* src = local(0, k, scratch.data());
      C* dst = result + seg_begin(k);
      if (src != dst) std::memcpy(dst, src, seg_len(k) * sizeof(C));
    }
    return;
  }
  if (chunk == 0) return;

  const uint64_t base_slot = ::gloo::Slot::build(kRingReduceScatterSlotPrefix, tag);
  auto slot_of = [&](int step) { return base_slot + (static_cast<uint64_t>(step) << 32); };
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  auto chunk_index = [&](int k) { return ((k % n) + n) % n; };

  auto wait_sends = [&](RingBuffer<C>& b, const char* role) {
    for (; b.sends_in_flight > 0; --b.sends_in_flight) {
      FSDP_CHECK_CODE(ErrorCode::kDeadlineExceeded, b.wire->waitSend(timeout), what,
                      ": ring reduce-scatter timed out sending ", role, " to rank ", right);
    }
  };

  using Role = RingReduceScatterWorkspace::Role;
  // Only a ring of more than two ranks forwards partial reductions, and needs the odd buffers.
  const bool forwards = n > 2;
  RingBuffer<C> recv[2] = {RingBuffer<C>(workspace, Role::kRecvEven, chunk),
                           RingBuffer<C>(workspace, Role::kRecvOdd, forwards ? chunk : 0)};
  RingBuffer<C> acc[2] = {RingBuffer<C>(workspace, Role::kAccEven, forwards ? chunk : 0),
                          RingBuffer<C>(workspace, Role::kAccOdd, forwards ? chunk : 0)};
  // Step 0 sends chunk r-1 of the input: in place, or converted into its own buffer.
  std::unique_ptr<RingBuffer<C>> first_send;  // holds the converted chunk when not direct
  std::unique_ptr<::gloo::transport::UnboundBuffer> input_wire;
  if (direct) {
    input_wire = ctx.createUnboundBuffer(const_cast<C*>(input_c),
                                         static_cast<size_t>(n) * chunk * sizeof(C));
  } else {
    first_send = std::make_unique<RingBuffer<C>>(workspace, Role::kFirstSend, chunk);
  }
  auto post_recvs = [&](int step) {
    for (size_t k = 0; k < segments; ++k) {
      recv[step % 2].wire->recv(left, slot_of(step), seg_begin(k) * sizeof(C),
                                seg_len(k) * sizeof(C));
    }
  };

  post_recvs(0);
  if (forwards) post_recvs(1);
  const int first_index = chunk_index(r - 1);
  for (size_t k = 0; k < segments; ++k) {
    if (direct) {
      input_wire->send(right, slot_of(0),
                       (static_cast<size_t>(first_index) * chunk + seg_begin(k)) * sizeof(C),
                       seg_len(k) * sizeof(C));
    } else {
      local(first_index, k, first_send->data + seg_begin(k));
      first_send->wire->send(right, slot_of(0), seg_begin(k) * sizeof(C), seg_len(k) * sizeof(C));
    }
  }
  int first_sends = static_cast<int>(segments);

  for (int step = 0; step < n - 1; ++step) {
    const bool last = step == n - 2;
    const int index = chunk_index(r - step - 2);  // the chunk arriving in this step
    RingBuffer<C>& in = recv[step % 2];
    RingBuffer<C>& out = acc[step % 2];
    if (!last) wait_sends(out, "a partial reduction");  // its sends of step - 2
    C* dst = last ? result : out.data;
    for (size_t k = 0; k < segments; ++k) {
      FSDP_CHECK_CODE(ErrorCode::kDeadlineExceeded, in.wire->waitRecv(timeout), what,
                      ": ring reduce-scatter step ", step, " timed out receiving from rank ",
                      left);
      const size_t b = seg_begin(k);
      const C* mine = local(index, k, scratch.data());
      CombineElements<C>(options.op, dst + b, mine, in.data + b, seg_len(k));
      if (!last) {
        out.wire->send(right, slot_of(step + 1), b * sizeof(C), seg_len(k) * sizeof(C));
        ++out.sends_in_flight;
      }
    }
    // This step's receive buffer is free again: post the receives of step + 2 into it.
    if (step + 2 <= n - 2) post_recvs(step + 2);
  }

  for (; first_sends > 0; --first_sends) {
    ::gloo::transport::UnboundBuffer& wire = direct ? *input_wire : *first_send->wire;
    FSDP_CHECK_CODE(ErrorCode::kDeadlineExceeded, wire.waitSend(timeout), what,
                    ": ring reduce-scatter timed out sending its input to rank ", right);
  }
  wait_sends(acc[0], "a partial reduction");
  wait_sends(acc[1], "a partial reduction");
}

template void RingReduceScatter<float>(RingReduceScatterWorkspace&, const char*, DType, size_t,
                                       const ReduceOptions&, float*, uint32_t,
                                       std::chrono::milliseconds, const std::string&);
template void RingReduceScatter<double>(RingReduceScatterWorkspace&, const char*, DType, size_t,
                                        const ReduceOptions&, double*, uint32_t,
                                        std::chrono::milliseconds, const std::string&);
template void RingReduceScatter<int64_t>(RingReduceScatterWorkspace&, const char*, DType, size_t,
                                         const ReduceOptions&, int64_t*, uint32_t,
                                         std::chrono::milliseconds, const std::string&);

}  // namespace fsdp::distributed
