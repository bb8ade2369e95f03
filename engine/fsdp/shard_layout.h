// Pure arithmetic of FSDP's sharding (docs/fsdp-behaviour.md, "Dim-0 sharding",
// "shard_placement_fn", "All-gather", "Reduce-scatter", "Gradient divide factors"):
// torch.chunk ranges along the shard dim (dim 0 by default) with empty trailing shards, padded
// shard sizes, the rank-major then
// parameter-major flat all-gather / reduce-scatter layouts, and gradient divide factors.
// No tensors, no state: every function is a value computation. Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::fsdp2 {

// The torch.chunk piece along `shard_dim` of one parameter owned by one rank. A "row" is one
// index along the shard dim (a dim-0 row for the default Shard(0)).
struct ShardInfo {
  int64_t shard_dim = 0;     // the FSDP placement's Shard(dim), normalized
  int64_t chunk_rows = 0;    // c = ceil(d / W): rows of the padded shard on every rank
  int64_t row_begin = 0;     // first row owned by this rank (clamped to d)
  int64_t rows = 0;          // rows owned by this rank: may be 0 even when d >= W
  int64_t row_numel = 1;     // product of the other dims ("rest")
  Shape sharded_shape;       // unpadded local shard shape: the global shape with d = rows
  Shape padded_shard_shape;  // the global shape with d = c
  int64_t padded_shard_numel() const { return chunk_rows * row_numel; }
  int64_t sharded_numel() const { return rows * row_numel; }
};

// The shard along `shard_dim` (in [0, global_shape.size())) of a parameter of shape
// `global_shape` (dim >= 1) on `rank` of `world`.
ShardInfo ComputeShardInfo(const Shape& global_shape, int rank, int world, int64_t shard_dim = 0);

// The dim a "shard the largest dim" shard_placement_fn picks for a parameter of `shape` on
// `world` ranks (PyTorch's test_train_parity_shard_placement_fn_shard_largest_dim policy):
// the largest dim (the first on ties) among dim 0 and the dims whose size divides by `world`
// (a dim > 0 must shard evenly), so dim 0 when no other dim qualifies.
int64_t LargestEvenShardDim(const Shape& shape, int world);

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

// Gradient divide factors (E2/E3, docs/fsdp-behaviour.md, "Gradient divide factors"), as
// PyTorch's `_get_gradient_divide_factors`: the reduce-scatter's op over `shard_size` ranks, the
// HSDP all-reduce's op over `replicate_size` replicas, and the pre/post divides, for an optional
// user factor from set_gradient_divide_factor (<= 0: unset) and
// set_force_sum_reduction_for_comms.
struct DivideFactors {
  enum class Op { kAvg, kSum, kPremulSum };
  Op op = Op::kAvg;             // the reduce-scatter's
  Op all_reduce_op = Op::kAvg;  // HSDP's all-reduce across the replicas
  double pre_divide = 1.0;      // applied to the reduce-scatter input (1.0: skipped)
  double post_divide = 1.0;     // applied to the output (1.0: skipped)
  double premul = 1.0;          // factor of the reduce-scatter's PREMUL_SUM
};

// The pre/post split of factor F: p starts at 1 and doubles while F % p == 0 and F / p > p.
void PrePostSplit(double factor, double* pre, double* post);

// Only float32 and bfloat16 reduce without overflow risk (float16 and float64 sum with a
// pre/post divide, as PyTorch).
DivideFactors ComputeDivideFactors(DType reduce_dtype, int shard_size, int replicate_size = 1,
                                   double user_factor = 0.0, bool force_sum_reduction = false);

}  // namespace fsdp::fsdp2
