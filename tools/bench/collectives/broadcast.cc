// pg-bench's broadcast: ProcessGroup::broadcast, in place, always from rank 0 (kRoot). `size`
// is the tensor every rank holds. busbw factor 1. Check data: every rank's input holds its V
// over the full array; every rank's result is the root's.
// Ownership: kBroadcast has static storage duration. Thread-safety: stateless functions.
#include "tools/bench/check_data.h"
#include "tools/bench/collective_descriptor.h"

namespace fsdp::bench::collectives {

namespace {

constexpr int kRoot = 0;

double BusFactor(int /*world*/) { return 1; }

int64_t Check(const Tensor& output, const CollectiveCounts&, distributed::ReduceOp,
              int /*rank*/, int world) {
  return CountWrongCopies(output, 0, world, [](int64_t) { return kRoot; });
}

std::shared_ptr<distributed::Work> Run(distributed::ProcessGroup& pg,
                                       const CollectiveBuffers& buffers, distributed::ReduceOp,
                                       bool async_op) {
  return pg.broadcast(buffers.input, kRoot, async_op);
}

}  // namespace

extern const CollectiveDescriptor kBroadcast = {
    .name = "broadcast",
    .reduces = false,
    .root = kRoot,
    .in_place = true,
    .bus_factor = BusFactor,
    .counts = WholeArrayCounts,
    .fill = FillWholeArray,
    .check = Check,
    .run = Run,
};

}  // namespace fsdp::bench::collectives
