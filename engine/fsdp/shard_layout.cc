#include "engine/fsdp/shard_layout.h"

#include <cmath>

namespace fsdp::fsdp2 {

ShardInfo ComputeShardInfo(const Shape& global_shape, int rank, int world, int64_t shard_dim) {
  FSDP_CHECK(!global_shape.empty(),
             "fully_shard doesn't support scalar parameters; use a 1-D tensor with numel 1");
  FSDP_CHECK(world >= 1 && rank >= 0 && rank < world, "invalid rank ", rank, " for world size ",
             world);
  FSDP_CHECK(shard_dim >= 0 && shard_dim < static_cast<int64_t>(global_shape.size()),
             "Shard dim ", shard_dim, " is invalid for ", global_shape.size(), "D tensor: ",
             ShapeStr(global_shape));
  ShardInfo info;
  info.shard_dim = shard_dim;
  const int64_t d = global_shape[shard_dim];
  info.chunk_rows = (d + world - 1) / world;
  Shape rest = global_shape;
  rest.erase(rest.begin() + shard_dim);
  info.row_numel = Numel(rest);
  const int64_t begin = std::min<int64_t>(d, info.chunk_rows * rank);
  const int64_t end = std::min<int64_t>(d, info.chunk_rows * (rank + 1));
  info.row_begin = begin;
  info.rows = end - begin;
  info.sharded_shape = global_shape;
  info.sharded_shape[shard_dim] = info.rows;
  info.padded_shard_shape = global_shape;
  info.padded_shard_shape[shard_dim] = info.chunk_rows;
  return info;
}

int64_t LargestEvenShardDim(const Shape& shape, int world) {
  FSDP_CHECK(!shape.empty() && world >= 1, "LargestEvenShardDim: shape ", ShapeStr(shape),
             ", world size ", world);
  int64_t best = 0;
  for (int64_t d = 1; d < static_cast<int64_t>(shape.size()); ++d) {
    if (shape[d] % world == 0 && shape[d] > shape[best]) best = d;
  }
  return best;
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

DivideFactors ComputeDivideFactors(DType reduce_dtype, int shard_size, int replicate_size,
                                   double user_factor, bool force_sum_reduction) {
  DivideFactors f;
  const int n = shard_size * replicate_size;
  const bool overflow_risk = reduce_dtype != DType::kFloat32 && reduce_dtype != DType::kBFloat16;
  const bool user_set = user_factor > 0.0;
  if (!overflow_risk && !force_sum_reduction) {
    if (!user_set) {
      // An average over one rank is skipped.
      f.op = f.all_reduce_op = n == 1 ? DivideFactors::Op::kSum : DivideFactors::Op::kAvg;
    } else {
      // The reduce-scatter divides by the factor; the replicas' shards are then summed.
      if (user_factor == static_cast<double>(shard_size)) {
        f.op = DivideFactors::Op::kAvg;
      } else {
        f.op = DivideFactors::Op::kPremulSum;
        f.premul = 1.0 / user_factor;
      }
      f.all_reduce_op = DivideFactors::Op::kSum;
    }
    return f;
  }
  const double factor = user_set ? user_factor : static_cast<double>(n);
  f.op = f.all_reduce_op = DivideFactors::Op::kSum;
  if (overflow_risk) {
    PrePostSplit(factor, &f.pre_divide, &f.post_divide);
  } else {
    f.post_divide = factor;
  }
  return f;
}

}  // namespace fsdp::fsdp2
