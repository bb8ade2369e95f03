#include "engine/fsdp/shard_layout.h"

#include <cmath>

namespace fsdp::fsdp2 {

ShardInfo ComputeShardInfo(const Shape& global_shape, int rank, int world) {
  FSDP_CHECK(!global_shape.empty(),
             "fully_shard doesn't support scalar parameters; use a 1-D tensor with numel 1");
  FSDP_CHECK(world >= 1 && rank >= 0 && rank < world, "invalid rank ", rank, " for world size ",
             world);
  ShardInfo info;
  const int64_t d0 = global_shape[0];
  info.chunk_rows = (d0 + world - 1) / world;
  info.row_numel = Numel(Shape(global_shape.begin() + 1, global_shape.end()));
  const int64_t begin = std::min<int64_t>(d0, info.chunk_rows * rank);
  const int64_t end = std::min<int64_t>(d0, info.chunk_rows * (rank + 1));
  info.row_begin = begin;
  info.rows = end - begin;
  info.sharded_shape = global_shape;
  info.sharded_shape[0] = info.rows;
  info.padded_shard_shape = global_shape;
  info.padded_shard_shape[0] = info.chunk_rows;
  return info;
}

GroupLayout ComputeGroupLayout(const std::vector<Shape>& global_shapes, int world) {
  GroupLayout layout;
  for (const Shape& shape : global_shapes) {
    const ShardInfo info = ComputeShardInfo(shape, 0, world);
    layout.offsets.push_back(layout.per_rank_numel);
    layout.padded_shard_numels.push_back(info.padded_shard_numel());
    layout.per_rank_numel += info.padded_shard_numel();
  }
  return layout;
}

void PrePostSplit(double factor, double* pre, double* post) {
  double p = 1.0;
  while (std::fmod(factor, p) == 0.0 && factor / p > p) p *= 2.0;
  *pre = p;
  *post = factor / p;
}

DivideFactors ComputeDivideFactors(DType reduce_dtype, int data_parallel_size, double user_factor,
                                   bool force_sum_reduction) {
  DivideFactors f;
  const int n = data_parallel_size;
  const bool overflow_risk = reduce_dtype != DType::kFloat32 && reduce_dtype != DType::kBFloat16 &&
                             reduce_dtype != DType::kFloat64;
  const bool user_set = user_factor > 0.0;
  if (!overflow_risk && !force_sum_reduction) {
    if (!user_set || user_factor == static_cast<double>(n)) {
      f.op = n == 1 ? DivideFactors::Op::kSum : DivideFactors::Op::kAvg;
    } else {
      f.op = DivideFactors::Op::kPremulSum;
      f.premul = 1.0 / user_factor;
    }
    return f;
  }
  const double factor = user_set ? user_factor : static_cast<double>(n);
  f.op = DivideFactors::Op::kSum;
  if (overflow_risk) {
    PrePostSplit(factor, &f.pre_divide, &f.post_divide);
  } else {
    f.post_divide = factor;
  }
  return f;
}

}  // namespace fsdp::fsdp2
