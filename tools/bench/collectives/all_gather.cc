// pg-bench's all_gather: ProcessGroup::all_gather_into_tensor (c10d's _allgather_base_).
// Each rank contributes count / n elements; `size` is the gathered output. busbw factor
// (n - 1) / n. Check data: rank r's input is slice r of the full array, and every rank's
// output is the full array, element j coming from rank j / (count / n).
// Ownership: kAllGather has static storage duration. Thread-safety: stateless functions.
#include "tools/bench/check_data.h"
#include "tools/bench/collective_descriptor.h"

namespace fsdp::bench::collectives {

namespace {

CollectiveCounts Counts(int64_t requested_bytes, DType dtype, int world) {
  CollectiveCounts c = EvenSplitCounts(requested_bytes, dtype, world);
  c.input_numel = c.per_rank_numel;
  c.output_numel = c.count;
  return c;
}

void Fill(const Tensor& input, const CollectiveCounts& counts, int rank, int world) {
  FillCheckValues(input, rank, rank * counts.per_rank_numel, world);
}

int64_t Check(const Tensor& output, const CollectiveCounts& counts, distributed::ReduceOp,
              int /*rank*/, int world) {
  const int64_t per_rank = counts.per_rank_numel;
  return CountWrongCopies(output, 0, world,
                          [per_rank](int64_t j) { return static_cast<int>(j / per_rank); });
}

std::shared_ptr<distributed::Work> Run(distributed::ProcessGroup& pg,
                                       const CollectiveBuffers& buffers, distributed::ReduceOp,
                                       bool async_op) {
  return pg.all_gather_into_tensor(buffers.output, buffers.input, async_op);
}

}  // namespace

extern const CollectiveDescriptor kAllGather = {
    .name = "all_gather",
    .reduces = false,
    .root = -1,
    .in_place = false,
    .bus_factor = RingFactor,
    .counts = Counts,
    .fill = Fill,
    .check = Check,
    .run = Run,
};

}  // namespace fsdp::bench::collectives
