// The arithmetic of an nccl-tests-style collective benchmark: which collectives, how a byte
// size becomes element counts per rank, the size sweep, and the bandwidth definitions of
// nccl-tests (doc/PERFORMANCE.md there):
//
//   algbw = size / time                        (size: the full array, see below)
//   busbw = algbw * factor(op, n)
//     all_gather, reduce_scatter: (n - 1) / n
//     all_reduce:                 2 (n - 1) / n
//     broadcast:                  1
//
// `size` is the whole (gathered / input) array: the all_gather output, the reduce_scatter
// input, the all_reduce / broadcast tensor. Element counts are rounded down so the array splits
// evenly over n ranks for all_gather and reduce_scatter (nccl-tests does the same), which may
// make a row's size smaller than asked.
//
// Also the names pg-bench prints: nccl-tests' datatype names ("float", "double", "half",
// "bfloat16", "int64") and reduce-op names ("sum", "avg", "min", "max").
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/dist/reduce_op.h"

namespace fsdp::bench {

enum class BenchCollective { kAllGather, kReduceScatter, kAllReduce, kBroadcast };

// Every collective, in the order `-o all` runs them.
const std::vector<BenchCollective>& AllBenchCollectives();
// "all_gather", "reduce_scatter", "all_reduce", "broadcast".
const char* BenchCollectiveName(BenchCollective op);
// Parses one name (also "allgather", "reducescatter", "allreduce", "all-gather", ...);
// "all" gives every collective. Throws InvalidArgument listing the choices.
std::vector<BenchCollective> ParseBenchCollectives(const std::string& name);
// True for the collectives that take a reduce op (reduce_scatter, all_reduce).
bool IsReduction(BenchCollective op);
// nccl-tests' root column: 0 for broadcast (pg-bench always broadcasts from rank 0), -1 else.
int BenchRoot(BenchCollective op);

// nccl-tests' name of a dtype: "float", "double", "half", "bfloat16", "int64".
const char* NcclTypeName(DType dtype);
// Parses nccl-tests names and PyTorch spellings (float32, fp16, bf16, ...). Throws
// InvalidArgument listing the choices.
DType ParseBenchDType(const std::string& name);
// "sum", "avg", "min", "max" ("premul_sum" for completeness).
const char* RedOpName(dist::ReduceOp op);
// Parses "sum", "avg", "min", "max" (any case). Throws InvalidArgument listing the choices.
dist::ReduceOp ParseRedOp(const std::string& name);

// busbw / algbw for `op` on `world_size` ranks (world_size >= 1).
double BusBandwidthFactor(BenchCollective op, int world_size);
// bytes / seconds in GB/s (1e9 bytes per second). Zero time gives 0.
double AlgBandwidthGBps(int64_t bytes, double seconds);

// The element counts of one benchmark row.
struct CollectiveCounts {
  int64_t count = 0;           // elements of the full array (the printed `count`)
  int64_t bytes = 0;           // count * element size (the printed `size`)
  int64_t input_numel = 0;     // per-rank input tensor
  int64_t output_numel = 0;    // per-rank output tensor (== input for in-place collectives)
  int64_t per_rank_numel = 0;  // count / world for all_gather and reduce_scatter, else count
};
// The counts for `requested_bytes` of `dtype` on `world_size` ranks, rounded down to whole
// elements and, for all_gather / reduce_scatter, to a multiple of world_size. count == 0 means
// the size is too small to run.
CollectiveCounts ComputeCounts(BenchCollective op, int64_t requested_bytes, DType dtype,
                               int world_size);

// The byte sizes of a sweep, as nccl-tests: min, then size * factor while factor > 1, else
// size + step, up to and including max. Throws InvalidArgument when min > max, when min is 0
// with a factor (it would never grow), or when neither factor > 1 nor step > 0 (unless
// min == max: one size).
std::vector<int64_t> SizeSweep(int64_t min_bytes, int64_t max_bytes, int64_t factor,
                               int64_t step_bytes);

}  // namespace fsdp::bench
