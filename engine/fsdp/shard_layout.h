// Pure arithmetic of FSDP's dim-0 sharding (docs/fsdp-behaviour.md, "Dim-0 sharding",
// "All-gather", "Reduce-scatter", "Gradient divide factors"):
// torch.chunk row ranges with empty trailing shards, padded shard sizes, the rank-major then
// parameter-major flat all-gather / reduce-scatter layouts, and gradient divide factors.
// No tensors, no state: every function is a value computation. Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::fsdp2 {

// The dim-0 chunk of one parameter owned by one rank.
struct ShardInfo {
  int64_t chunk_rows = 0;    // c = ceil(d0 / W): rows of the padded shard on every rank
  int64_t row_begin = 0;     // first row owned by this rank (clamped to d0)
  int64_t rows = 0;          // rows owned by this rank: may be 0 even when d0 >= W
  int64_t row_numel = 1;     // product of the non-leading dims ("rest")
  Shape sharded_shape;       // unpadded local shard shape: [rows, *rest]
  Shape padded_shard_shape;  // [c, *rest]
  int64_t padded_shard_numel() const { return chunk_rows * row_numel; }
  int64_t sharded_numel() const { return rows * row_numel; }
};

// The shard of a parameter of shape `global_shape` (dim >= 1) on `rank` of `world`.
ShardInfo ComputeShardInfo(const Shape& global_shape, int rank, int world);

// The flat-buffer layout of a parameter group for one collective: per-parameter offsets of the
// padded shards inside one rank's slice. Used by the all-gather (copy-in / copy-out) and by the
// reduce-scatter (copy-in / view-out), which walk parameters in group order.
struct GroupLayout {
  std::vector<int64_t> padded_shard_numels;  // per parameter, group order
  std::vector<int64_t> offsets;              // start of each parameter inside a rank's slice
  int64_t per_rank_numel = 0;                // L = sum of padded shard numels
  int64_t total_numel(int world) const { return per_rank_numel * world; }
};

GroupLayout ComputeGroupLayout(const std::vector<Shape>& global_shapes, int world);

// Gradient divide factors (E2/E3, docs/fsdp-behaviour.md, "Gradient divide factors") for
// data-parallel size `n`, optionally a
// user factor from set_gradient_divide_factor (<= 0: unset).
struct DivideFactors {
  enum class Op { kAvg, kSum, kPremulSum };
  Op op = Op::kAvg;
  double pre_divide = 1.0;   // applied to the reduce-scatter input (1.0: skipped)
  double post_divide = 1.0;  // applied to the output (1.0: skipped)
  double premul = 1.0;       // factor of PREMUL_SUM
};

// The pre/post split of factor F: p starts at 1 and doubles while F % p == 0 and F / p > p.
void PrePostSplit(double factor, double* pre, double* post);

DivideFactors ComputeDivideFactors(DType reduce_dtype, int data_parallel_size,
                                   double user_factor = 0.0, bool force_sum_reduction = false);

}  // namespace fsdp::fsdp2
