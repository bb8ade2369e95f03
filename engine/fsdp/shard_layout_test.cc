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

TEST(FsdpShardLayout, DivideFactorsByReduceDtype) {
  DivideFactors f32 = ComputeDivideFactors(DType::kFloat32, 4);
  EXPECT_EQ(f32.op, DivideFactors::Op::kAvg);
  EXPECT_EQ(ComputeDivideFactors(DType::kBFloat16, 4).op, DivideFactors::Op::kAvg);
  EXPECT_EQ(ComputeDivideFactors(DType::kFloat32, 1).op, DivideFactors::Op::kSum);
  DivideFactors f16 = ComputeDivideFactors(DType::kFloat16, 128);
  EXPECT_EQ(f16.op, DivideFactors::Op::kSum);
  EXPECT_EQ(f16.pre_divide, 16);
  EXPECT_EQ(f16.post_divide, 8);
  DivideFactors user = ComputeDivideFactors(DType::kFloat32, 4, 2.0);
  EXPECT_EQ(user.op, DivideFactors::Op::kPremulSum);
  EXPECT_EQ(user.premul, 0.5);
  DivideFactors forced = ComputeDivideFactors(DType::kFloat32, 4, 0.0, true);
  EXPECT_EQ(forced.op, DivideFactors::Op::kSum);
  EXPECT_EQ(forced.pre_divide, 1);
  EXPECT_EQ(forced.post_divide, 4);
}

}  // namespace
}  // namespace fsdp::fsdp2
