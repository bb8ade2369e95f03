// The collective-independent arithmetic of an nccl-tests-style collective benchmark: how a
// byte size becomes element counts, the size sweep, and the bandwidth definitions of
// nccl-tests (doc/PERFORMANCE.md there):
//
//   algbw = size / time                        (size: the full array, see below)
//   busbw = algbw * factor(collective, n)      (each collective's descriptor gives its factor,
//                                               tools/bench/collective_descriptor.h)
//
// `size` is the whole (gathered / input) array: the all_gather output, the reduce_scatter
// input, the all_reduce / broadcast tensor. Collectives that split the array over the ranks
// round the element count down so it splits evenly over n ranks (nccl-tests does the same),
// which may make a row's size smaller than asked (EvenSplitCounts).
//
// Also the names pg-bench prints: nccl-tests' datatype names ("float", "double", "half",
// "bfloat16", "int64") and reduce-op names ("sum", "avg", "min", "max").
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/distributed/reduce_op.h"

namespace fsdp::bench {

// `name` in lower case without '-' and '_': how pg-bench compares the names of collectives,
// datatypes and reduce ops ("All-Reduce" == "allreduce" == "all_reduce").
std::string NormalizedName(const std::string& name);

// nccl-tests' name of a dtype: "float", "double", "half", "bfloat16", "int64".
const char* NcclTypeName(DType dtype);
// Parses nccl-tests names and PyTorch spellings (float32, fp16, bf16, ...). Throws
// InvalidArgument listing the choices.
DType ParseBenchDType(const std::string& name);
// "sum", "avg", "min", "max" ("premul_sum" for completeness).
const char* RedOpName(distributed::ReduceOp op);
// Parses "sum", "avg", "min", "max" (any case). Throws InvalidArgument listing the choices.
distributed::ReduceOp ParseRedOp(const std::string& name);

// (n - 1) / n: the bus-bandwidth factor of the ring collectives (all_gather,
// reduce_scatter; twice it for all_reduce). Throws InvalidArgument unless world_size >= 1.
double RingFactor(int world_size);
// bytes / seconds in GB/s (1e9 bytes per second). Zero time gives 0.
double AlgBandwidthGBps(int64_t bytes, double seconds);

// The element counts of one benchmark row.
struct CollectiveCounts {
  int64_t count = 0;           // elements of the full array (the printed `count`)
  int64_t bytes = 0;           // count * element size (the printed `size`)
  int64_t input_numel = 0;     // per-rank input tensor
  int64_t output_numel = 0;    // per-rank output tensor (== input for in-place collectives)
  int64_t per_rank_numel = 0;  // count / world for collectives that split the array, else count
};
// The counts of a collective whose every rank holds the whole array (all_reduce, broadcast):
// `requested_bytes` of `dtype` rounded down to whole elements; input = output = per rank =
// count. `world_size` does not matter (the signature is CollectiveDescriptor::counts').
CollectiveCounts WholeArrayCounts(int64_t requested_bytes, DType dtype, int world_size);
// The counts of a collective that splits the array evenly over `world_size` ranks
// (all_gather, reduce_scatter): count rounded down to a multiple of world_size, per rank =
// count / world_size. input_numel and output_numel are left 0 for the caller to set.
CollectiveCounts EvenSplitCounts(int64_t requested_bytes, DType dtype, int world_size);

// The byte sizes of a sweep, as nccl-tests: min, then size * factor while factor > 1, else
// size + step, up to and including max. Throws InvalidArgument when min > max, when min is 0
// with a factor (it would never grow), or when neither factor > 1 nor step > 0 (unless
// min == max: one size).
std::vector<int64_t> SizeSweep(int64_t min_bytes, int64_t max_bytes, int64_t factor,
                               int64_t step_bytes);

}  // namespace fsdp::bench
