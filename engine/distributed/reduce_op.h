// ReduceOp and the reference reduction kernel shared by the in-process backends.
//
// ReduceOp mirrors c10d's ReduceOp for the ops FSDP uses: SUM, AVG, MIN, MAX and PREMUL_SUM
// (each rank's input is scaled by that rank's factor before the sum, as
// torch.distributed._make_nccl_premul_sum does). AVG and PREMUL_SUM need a floating-point
// dtype, like NCCL.
//
// ReduceInRankOrder is the numerics contract of the threaded fake (see
// docs/process_groups.md, [Note: rank-order reduction]): element i of the result is
// reduced from rank 0, then rank 1, ... in an accumulator of float (f32, f16, bf16), double
// (f64) or int64 (i64), and rounded to the payload dtype once at the end. Results are
// therefore bit-reproducible and identical on every rank.
// Thread-safety: stateless functions.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/core/dtype.h"

namespace fsdp::distributed {

enum class ReduceOp { kSum, kAvg, kMin, kMax, kPremulSum };

// "SUM", "AVG", "MIN", "MAX", "PREMUL_SUM" (c10d's spelling).
const char* ReduceOpName(ReduceOp op);

struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;  // Default: SUM
  // Used by kPremulSum only: this rank's input is multiplied by the factor (in the
  // accumulator type) before the sum. Ranks may pass different factors. Default: 1.0.
  double premul_factor = 1.0;
};

// Convenience constructors, as torch spells them.
inline ReduceOptions Sum() { return {ReduceOp::kSum, 1.0}; }
inline ReduceOptions Avg() { return {ReduceOp::kAvg, 1.0}; }
inline ReduceOptions Min() { return {ReduceOp::kMin, 1.0}; }
inline ReduceOptions Max() { return {ReduceOp::kMax, 1.0}; }
inline ReduceOptions PremulSum(double factor) { return {ReduceOp::kPremulSum, factor}; }

// True when `op` may reduce tensors of `dtype` (AVG and PREMUL_SUM need floating point).
bool ReduceOpSupports(ReduceOp op, DType dtype);

// Reduces `inputs[r][0, numel)` over r = 0..inputs.size()-1 into `output[0, numel)` in rank
// order (see the file comment). `premul_factors` has one factor per input for kPremulSum and
// is ignored otherwise. `output` may be identical to any input pointer (element i of the
// output is written only after element i of every input was read); other overlaps are not
// allowed. Throws InvalidArgument when the op does not support the dtype.
void ReduceInRankOrder(DType dtype, ReduceOp op, const std::vector<const void*>& inputs,
                       const std::vector<double>& premul_factors, void* output, size_t numel);

}  // namespace fsdp::distributed
