#include "engine/fsdp/shard_layout.h"

#include <gtest/gtest.h>

namespace fsdp::fsdp2 {
namespace {

std::vector<int64_t> RowsPerRank(const Shape& shape, int world) {
  std::vector<int64_t> rows;
  for (int r = 0; r < world; ++r) rows.push_back(ComputeShardInfo(shape, r, world).rows);
  return rows;
}

TEST(FsdpShardLayout, TorchChunkRowsWithEmptyTrailingShards) {
  // The table of docs/fsdp-behaviour.md, "Dim-0 sharding".
  EXPECT_EQ(RowsPerRank({5, 3}, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(RowsPerRank({6, 4}, 4), (std::vector<int64_t>{2, 2, 2, 0}));
  EXPECT_EQ(RowsPerRank({7}, 4), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(RowsPerRank({1, 8}, 2), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(RowsPerRank({16, 64}, 4), (std::vector<int64_t>{4, 4, 4, 4}));
  auto rows = RowsPerRank({17, 257}, 128);
  for (int r = 0; r < 128; ++r) EXPECT_EQ(rows[r], r < 17 ? 1 : 0) << r;
  const ShardInfo empty = ComputeShardInfo({5, 3}, 3, 4);
  EXPECT_EQ(empty.sharded_shape, (Shape{0, 3}));
  EXPECT_EQ(empty.padded_shard_shape, (Shape{2, 3}));
  EXPECT_EQ(empty.row_begin, 5);
  EXPECT_THROW(ComputeShardInfo({}, 0, 2), Error);
  EXPECT_THROW(ComputeShardInfo({4}, 2, 2), Error);
}

TEST(FsdpShardLayout, GroupLayoutOfTheWorkedExample) {
  // docs/fsdp-behaviour.md, "All-gather": p0 [5,3], p1 [3], W = 4 -> L = 7, output 28.
  const GroupLayout layout = ComputeGroupLayout({{5, 3}, {3}}, 4);
  EXPECT_EQ(layout.per_rank_numel, 7);
  EXPECT_EQ(layout.total_numel(4), 28);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(layout.padded_shard_numels, (std::vector<int64_t>{6, 1}));
}

TEST(FsdpShardLayout, PrePostSplitMatchesTheTable) {
  const std::vector<std::tuple<double, double, double>> table = {
      {1, 1, 1}, {2, 2, 1}, {3, 2, 1.5}, {4, 2, 2}, {6, 4, 1.5}, {8, 4, 2},
      {16, 4, 4}, {32, 8, 4}, {64, 8, 8}, {128, 16, 8}};
  for (const auto& [f, pre, post] : table) {
    double p = 0, q = 0;
    PrePostSplit(f, &p, &q);
    EXPECT_EQ(p, pre) << "F=" << f;
    EXPECT_EQ(q, post) << "F=" << f;
  }
}

TEST(FsdpShardLayout, ShardInfoAlongAnyDimTilesTheParameter) {
  // For every dim and world, the ranks' pieces along the dim tile [0, d) in order with
  // torch.chunk sizes, the other dims untouched.
  const Shape shape{5, 6, 4};
  for (int world = 1; world <= 6; ++world) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      int64_t next = 0;
      for (int rank = 0; rank < world; ++rank) {
        const ShardInfo info = ComputeShardInfo(shape, rank, world, dim);
        EXPECT_EQ(info.shard_dim, dim);
        EXPECT_EQ(info.chunk_rows, (shape[dim] + world - 1) / world);
        EXPECT_EQ(info.row_begin, next);
        EXPECT_EQ(info.rows, std::min(info.chunk_rows, shape[dim] - next));
        EXPECT_EQ(info.row_numel * shape[dim], Numel(shape));
        Shape want = shape;
        want[dim] = info.rows;
        EXPECT_EQ(info.sharded_shape, want);
        next += info.rows;
      }
      EXPECT_EQ(next, shape[dim]) << "world " << world << " dim " << dim;
    }
  }
  EXPECT_THROW(ComputeShardInfo(shape, 0, 2, 3), Error);
}

TEST(FsdpShardLayout, LargestEvenShardDim) {
  // The largest dim among dim 0 and the dims dividing by the world (first on ties).
  for (const Shape& shape : {Shape{8, 16}, Shape{16, 16}, Shape{7, 24}, Shape{96, 24}, Shape{5}}) {
    for (int world : {1, 2, 3, 4, 5}) {
      const int64_t d = LargestEvenShardDim(shape, world);
      EXPECT_TRUE(d == 0 || shape[d] % world == 0);
      for (int64_t o = 0; o < static_cast<int64_t>(shape.size()); ++o) {
        const bool eligible = o == 0 || shape[o] % world == 0;
        if (eligible && o < d) EXPECT_LT(shape[o], shape[d]);
        if (eligible && o > d) EXPECT_LE(shape[o], shape[d]);
      }
    }
  }
}

TEST(FsdpShardLayout, DivideFactorsByReduceDtype) {
  DivideFactors f32 = ComputeDivideFactors(DType::kFloat32, 4);
  EXPECT_EQ(f32.op, DivideFactors::Op::kAvg);
  EXPECT_EQ(ComputeDivideFactors(DType::kBFloat16, 4).op, DivideFactors::Op::kAvg);
  EXPECT_EQ(ComputeDivideFactors(DType::kFloat32, 1).op, DivideFactors::Op::kSum);
  DivideFactors f16 = ComputeDivideFactors(DType::kFloat16, 128);
  EXPECT_EQ(f16.op, DivideFactors::Op::kSum);
  EXPECT_EQ(f16.pre_divide, 16);
  EXPECT_EQ(f16.post_divide, 8);
  DivideFactors user = ComputeDivideFactors(DType::kFloat32, 4, 1, 2.0);
  EXPECT_EQ(user.op, DivideFactors::Op::kPremulSum);
  EXPECT_EQ(user.premul, 0.5);
  DivideFactors forced = ComputeDivideFactors(DType::kFloat32, 4, 1, 0.0, true);
  EXPECT_EQ(forced.op, DivideFactors::Op::kSum);
  EXPECT_EQ(forced.pre_divide, 1);
  EXPECT_EQ(forced.post_divide, 4);
  // float64 has an overflow risk in PyTorch's rule: SUM with the factor split.
  DivideFactors f64 = ComputeDivideFactors(DType::kFloat64, 4);
  EXPECT_EQ(f64.op, DivideFactors::Op::kSum);
  EXPECT_EQ(f64.pre_divide, 2);
  EXPECT_EQ(f64.post_divide, 2);
}

TEST(FsdpShardLayout, DivideFactorsOfHsdp) {
  // No factor: both average (over the shard group, then over the replicas).
  DivideFactors plain = ComputeDivideFactors(DType::kFloat32, 2, 2);
  EXPECT_EQ(plain.op, DivideFactors::Op::kAvg);
  EXPECT_EQ(plain.all_reduce_op, DivideFactors::Op::kAvg);
  // A factor equal to the shard size: the reduce-scatter averages, the all-reduce sums.
  DivideFactors shard = ComputeDivideFactors(DType::kFloat32, 2, 2, 2.0);
  EXPECT_EQ(shard.op, DivideFactors::Op::kAvg);
  EXPECT_EQ(shard.all_reduce_op, DivideFactors::Op::kSum);
  DivideFactors other = ComputeDivideFactors(DType::kFloat32, 2, 2, 8.0);
  EXPECT_EQ(other.op, DivideFactors::Op::kPremulSum);
  EXPECT_EQ(other.premul, 0.125);
  EXPECT_EQ(other.all_reduce_op, DivideFactors::Op::kSum);
  // Forced sum: both sum, one post-divide by the data-parallel size.
  DivideFactors forced = ComputeDivideFactors(DType::kBFloat16, 2, 2, 0.0, true);
  EXPECT_EQ(forced.op, DivideFactors::Op::kSum);
  EXPECT_EQ(forced.all_reduce_op, DivideFactors::Op::kSum);
  EXPECT_EQ(forced.post_divide, 4);
  // No average over one rank.
  EXPECT_EQ(ComputeDivideFactors(DType::kFloat32, 1, 1).all_reduce_op, DivideFactors::Op::kSum);
}

}  // namespace
}  // namespace fsdp::fsdp2
