// pg-bench's reduce_scatter: ProcessGroup::reduce_scatter_tensor (c10d's
// _reduce_scatter_base_) with -r's reduce op. Each rank's input is the full array of `size`;
// each output count / n elements. busbw factor (n - 1) / n. Check data: every rank's input
// holds its V over the full array; rank r's output is slice r of the reduction.
// Ownership: kReduceScatter has static storage duration. Thread-safety: stateless functions.
#include "tools/bench/check_data.h"
#include "tools/bench/collective_descriptor.h"

namespace fsdp::bench::collectives {

namespace {

CollectiveCounts Counts(int64_t requested_bytes, DType dtype, int world) {
  CollectiveCounts c = EvenSplitCounts(requested_bytes, dtype, world);
  c.input_numel = c.count;
  c.output_numel = c.per_rank_numel;
  return c;
}

int64_t Check(const Tensor& output, const CollectiveCounts& counts, distributed::ReduceOp redop,
              int rank, int world) {
  return CountWrongReduction(output, rank * counts.per_rank_numel, redop, world);
}

std::shared_ptr<distributed::Work> Run(distributed::ProcessGroup& pg,
                                       const CollectiveBuffers& buffers,
                                       distributed::ReduceOp redop, bool async_op) {
  return pg.reduce_scatter_tensor(buffers.output, buffers.input, {redop, 1.0}, async_op);
}

}  // namespace

extern const CollectiveDescriptor kReduceScatter = {
    .name = "reduce_scatter",
    .reduces = true,
    .root = -1,
    .in_place = false,
    .bus_factor = RingFactor,
    .counts = Counts,
    .fill = FillWholeArray,
    .check = Check,
    .run = Run,
};

}  // namespace fsdp::bench::collectives
