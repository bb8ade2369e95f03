// pg-bench's all_reduce: ProcessGroup::all_reduce, in place, with -r's reduce op. `size` is
// the tensor every rank holds. busbw factor 2 (n - 1) / n. Check data: every rank's input
// holds its V over the full array; every rank's result is the reduction.
// Ownership: kAllReduce has static storage duration. Thread-safety: stateless functions.
#include "tools/bench/check_data.h"
#include "tools/bench/collective_descriptor.h"

namespace fsdp::bench::collectives {

namespace {

double BusFactor(int world) { return 2 * RingFactor(world); }

int64_t Check(const Tensor& output, const CollectiveCounts&, distributed::ReduceOp redop,
              int /*rank*/, int world) {
  return CountWrongReduction(output, 0, redop, world);
}

std::shared_ptr<distributed::Work> Run(distributed::ProcessGroup& pg,
                                       const CollectiveBuffers& buffers,
                                       distributed::ReduceOp redop, bool async_op) {
  return pg.all_reduce(buffers.input, {redop, 1.0}, async_op);
}

}  // namespace

extern const CollectiveDescriptor kAllReduce = {
    .name = "all_reduce",
    .reduces = true,
    .root = -1,
    .in_place = true,
    .bus_factor = BusFactor,
    .counts = WholeArrayCounts,
    .fill = FillWholeArray,
    .check = Check,
    .run = Run,
};

}  // namespace fsdp::bench::collectives
