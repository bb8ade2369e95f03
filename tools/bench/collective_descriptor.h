// CollectiveDescriptor: everything pg-bench knows about one collective, in one small table of
// functions, after nccl-tests (src/all_gather.cu, src/reduce_scatter.cu, ... each fill one
// `struct testColl`; src/common.cu does the rest). The harness (pg_bench_sweep, pg_bench_report,
// pg_bench_options) works on descriptors only and never names a collective; the descriptors
// live one per file in tools/bench/collectives/ and are listed in
// tools/bench/collectives/registry.cc. Adding a collective: one descriptor file plus one line
// in that list.
//
// The functions below the struct are the harness's entry points: they validate what is
// common to every collective (world size, tensor sizes) and call the descriptor.
//
// Ownership: descriptors are immutable objects with static storage duration; the harness
// holds `const CollectiveDescriptor*` to them.
// Thread-safety: descriptors are constant and their functions stateless; distinct ranks may
// call them concurrently (run: from the rank's own thread, ProcessGroup's rule).
#pragma once

#include <cstdint>
#include <memory>

#include "engine/core/device.h"
#include "engine/core/tensor.h"
#include "engine/distributed/process_group.h"
#include "engine/distributed/reduce_op.h"
#include "engine/distributed/work.h"
#include "tools/bench/bus_bandwidth.h"

namespace fsdp::bench {

// One rank's buffers of one collective at one size.
struct CollectiveBuffers {
  Tensor input;
  Tensor output;  // the same tensor as input for in-place collectives
};

struct CollectiveDescriptor {
  // nccl-tests' name, printed in the report and parsed by -o ("all_gather"; also accepted
  // without '_' or with '-', any case).
  const char* name = "";
  // Takes the reduce op (-r): the row's redop column, and -r avg needs a floating datatype.
  bool reduces = false;
  // nccl-tests' root column: the source rank of a rooted collective, -1 for none.
  int root = -1;
  // The output is the input tensor (one buffer per rank).
  bool in_place = false;
  // busbw / algbw on `world` ranks (nccl-tests' doc/PERFORMANCE.md). world >= 1.
  double (*bus_factor)(int world) = nullptr;
  // The counts of a row for `requested_bytes` of `dtype` on `world` ranks (bus_bandwidth.h:
  // WholeArrayCounts, EvenSplitCounts). per_rank_numel == 0: too small to run.
  CollectiveCounts (*counts)(int64_t requested_bytes, DType dtype, int world) = nullptr;
  // Fills rank `rank`'s input (counts.input_numel elements, on the host) with the check data
  // of [Note: exact check data] (check_data.h).
  void (*fill)(const Tensor& input, const CollectiveCounts& counts, int rank, int world) = nullptr;
  // Counts the elements of rank `rank`'s output (counts.output_numel elements, on the host)
  // that differ from what the collective must produce from fill's inputs.
  int64_t (*check)(const Tensor& output, const CollectiveCounts& counts,
                   distributed::ReduceOp redop, int rank, int world) = nullptr;
  // Issues the collective on `pg` over `buffers` (redop for reductions).
  std::shared_ptr<distributed::Work> (*run)(distributed::ProcessGroup& pg,
                                            const CollectiveBuffers& buffers,
                                            distributed::ReduceOp redop, bool async_op) = nullptr;
};

// descriptor.bus_factor(world_size); throws InvalidArgument unless world_size >= 1.
double BusBandwidthFactor(const CollectiveDescriptor& collective, int world_size);
// descriptor.counts(...); throws InvalidArgument unless world_size >= 1 and
// requested_bytes >= 0.
CollectiveCounts ComputeCounts(const CollectiveDescriptor& collective, int64_t requested_bytes,
                               DType dtype, int world_size);
// Zero-filled buffers of `counts` on `device` (one tensor when the collective is in place).
CollectiveBuffers AllocateBuffers(const CollectiveDescriptor& collective,
                                  const CollectiveCounts& counts, DType dtype, Device device);
// descriptor.fill(...) after checking input.numel() == counts.input_numel (InvalidArgument).
void FillCheckInput(const CollectiveDescriptor& collective, const Tensor& input,
                    const CollectiveCounts& counts, int rank, int world_size);
// descriptor.check(...) after checking output.numel() == counts.output_numel
// (InvalidArgument).
int64_t CountWrongElements(const CollectiveDescriptor& collective, distributed::ReduceOp redop,
                           const Tensor& output, const CollectiveCounts& counts, int rank,
                           int world_size);
// A stock CollectiveDescriptor::fill: rank `rank`'s input holds V(rank, j) of the whole array
// (j = 0 .. input numel), as every rank's input of all_reduce, reduce_scatter, broadcast.
void FillWholeArray(const Tensor& input, const CollectiveCounts& counts, int rank, int world);

// Issues the collective synchronously and waits for its Work.
void RunCollective(const CollectiveDescriptor& collective, distributed::ProcessGroup& pg,
                   const CollectiveBuffers& buffers, distributed::ReduceOp redop);

}  // namespace fsdp::bench
