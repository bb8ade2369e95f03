// The harness's entry points into a CollectiveDescriptor (collective_descriptor.h): the checks
// common to every collective, then the descriptor's own function.
// Thread-safety: stateless functions.
#include "tools/bench/collective_descriptor.h"

#include "engine/core/error.h"
#include "tools/bench/check_data.h"

namespace fsdp::bench {

double BusBandwidthFactor(const CollectiveDescriptor& collective, int world_size) {
  FSDP_CHECK(world_size >= 1, "BusBandwidthFactor: world size must be >= 1, got ", world_size);
  return collective.bus_factor(world_size);
}

CollectiveCounts ComputeCounts(const CollectiveDescriptor& collective, int64_t requested_bytes,
                               DType dtype, int world_size) {
  FSDP_CHECK(world_size >= 1, "ComputeCounts: world size must be >= 1, got ", world_size);
  FSDP_CHECK(requested_bytes >= 0, "ComputeCounts: negative size ", requested_bytes);
  return collective.counts(requested_bytes, dtype, world_size);
}

CollectiveBuffers AllocateBuffers(const CollectiveDescriptor& collective,
                                  const CollectiveCounts& counts, DType dtype, Device device) {
  CollectiveBuffers buffers;
  buffers.input = Tensor::zeros({counts.input_numel}, dtype, device);
  buffers.output = collective.in_place ? buffers.input
                                       : Tensor::zeros({counts.output_numel}, dtype, device);
  return buffers;
}

void FillCheckInput(const CollectiveDescriptor& collective, const Tensor& input,
                    const CollectiveCounts& counts, int rank, int world_size) {
  FSDP_CHECK(input.numel() == counts.input_numel, "check data: ", collective.name, " input has ",
             input.numel(), " elements, expected ", counts.input_numel);
  collective.fill(input, counts, rank, world_size);
}

int64_t CountWrongElements(const CollectiveDescriptor& collective, distributed::ReduceOp redop,
                           const Tensor& output, const CollectiveCounts& counts, int rank,
                           int world_size) {
  FSDP_CHECK(output.numel() == counts.output_numel, "check data: ", collective.name,
             " output has ", output.numel(), " elements, expected ", counts.output_numel);
  return collective.check(output, counts, redop, rank, world_size);
}

void FillWholeArray(const Tensor& input, const CollectiveCounts& /*counts*/, int rank,
                    int world) {
  FillCheckValues(input, rank, /*first=*/0, world);
}

void RunCollective(const CollectiveDescriptor& collective, distributed::ProcessGroup& pg,
                   const CollectiveBuffers& buffers, distributed::ReduceOp redop) {
  collective.run(pg, buffers, redop, /*async_op=*/false)->wait();
}

}  // namespace fsdp::bench
