#include "reference/sharding.h"

#include <gtest/gtest.h>

namespace fsdp::reference {
namespace {

std::vector<int64_t> RowsPerRank(int64_t dim0, int world) {
  const ChunkLayout l = MakeChunkLayout(dim0, world);
  std::vector<int64_t> rows;
  for (int r = 0; r < world; ++r) rows.push_back(l.RowsOnRank(r));
  return rows;
}

// 0, 1, 2, ... as a tensor of `shape`.
RefTensor Iota(const Shape& shape) {
  RefTensor t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<double>(i);
  return t;
}

TEST(ChunkLayoutTest, TorchChunkRowsPerRank) {
  // The table of docs/fsdp-behaviour.md, "Dim-0 sharding".
  EXPECT_EQ(RowsPerRank(6, 4), (std::vector<int64_t>{2, 2, 2, 0}));  // empty even though 6 >= 4
  EXPECT_EQ(RowsPerRank(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(RowsPerRank(7, 4), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(RowsPerRank(1, 2), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(RowsPerRank(16, 4), (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(RowsPerRank(5, 8), (std::vector<int64_t>{1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(RowsPerRank(0, 3), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(RowsPerRank(3, 1), (std::vector<int64_t>{3}));
  const ChunkLayout big = MakeChunkLayout(17, 128);
  EXPECT_EQ(big.chunk_rows, 1);
  EXPECT_EQ(big.NonEmptyShards(), 17);
  EXPECT_EQ(big.RowsOnRank(127), 0);
}

TEST(ChunkLayoutTest, PaddedSizesAndOffsets) {
  const ChunkLayout l = MakeChunkLayout(6, 4);
  EXPECT_EQ(l.chunk_rows, 2);
  EXPECT_EQ(l.PaddedDim0(), 8);
  EXPECT_EQ(l.NonEmptyShards(), 3);
  EXPECT_EQ(l.RowOffset(2), 4);
  EXPECT_EQ(l.RowOffset(3), 6);  // empty shard starts at the end
  const ChunkLayout e = MakeChunkLayout(0, 4);
  EXPECT_EQ(e.chunk_rows, 0);
  EXPECT_EQ(e.PaddedDim0(), 0);
  EXPECT_THROW(MakeChunkLayout(3, 0), std::invalid_argument);
  EXPECT_THROW(MakeChunkLayout(-1, 2), std::invalid_argument);
  // For every small case the shards tile [0, d0) in order and c = ceil(d0 / W).
  for (int64_t d0 = 0; d0 <= 20; ++d0) {
    for (int w = 1; w <= 9; ++w) {
      const ChunkLayout c = MakeChunkLayout(d0, w);
      int64_t next = 0;
      for (int r = 0; r < w; ++r) {
        EXPECT_EQ(c.RowOffset(r), next);
        EXPECT_GE(c.RowsOnRank(r), 0);
        EXPECT_LE(c.RowsOnRank(r), c.chunk_rows);
        next += c.RowsOnRank(r);
      }
      EXPECT_EQ(next, d0);
      if (d0 == 0) {
        EXPECT_EQ(c.chunk_rows, 0);
      } else {  // c = ceil(d0 / W): the smallest c with c * W >= d0
        EXPECT_GE(c.chunk_rows * w, d0);
        EXPECT_LT((c.chunk_rows - 1) * w, d0);
      }
    }
  }
}

TEST(ShardTest, ShardsAlongAnyDimHoldTheirChunkOfThatDim) {
  // Every element of rank r's piece along `dim` is the full tensor's element at the same index
  // shifted by r's chunk offset along `dim`; the pieces' sizes along `dim` add up to it.
  const Shape shape{3, 4, 6};
  const RefTensor full = Iota(shape);
  for (int world = 1; world <= 5; ++world) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      const ChunkLayout l = MakeChunkLayout(shape[dim], world);
      int64_t total = 0;
      for (int r = 0; r < world; ++r) {
        const RefTensor piece = ShardOf(full, r, world, dim);
        Shape want = shape;
        want[dim] = l.RowsOnRank(r);
        ASSERT_EQ(piece.shape, want);
        total += piece.shape[dim];
        for (int64_t i = 0; i < piece.numel(); ++i) {
          int64_t idx[3] = {i / (want[1] * want[2]), (i / want[2]) % want[1], i % want[2]};
          idx[dim] += l.RowOffset(r);
          EXPECT_EQ(piece.data[i], full.data[(idx[0] * shape[1] + idx[1]) * shape[2] + idx[2]]);
        }
      }
      EXPECT_EQ(total, shape[dim]);
    }
  }
  EXPECT_THROW(ShardOf(full, 0, 2, 3), std::invalid_argument);
  EXPECT_EQ(ShardsOf(RefTensorMap{{"w", full}}, 1, 2, {{"w", 2}}).at("w"), ShardOf(full, 1, 2, 2));
}

TEST(ShardTest, UnpaddedAndPaddedShardsOfFiveByThreeOverFour) {
  const RefTensor full = Iota({5, 3});
  EXPECT_EQ(ShardOf(full, 0, 4), RefTensor({2, 3}, {0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(ShardOf(full, 2, 4), RefTensor({1, 3}, {12, 13, 14}));
  EXPECT_EQ(ShardOf(full, 3, 4), RefTensor({0, 3}, {}));  // keeps the trailing dims
  EXPECT_EQ(PaddedShardOf(full, 2, 4), RefTensor({2, 3}, {12, 13, 14, 0, 0, 0}));
  EXPECT_EQ(PaddedShardOf(full, 3, 4), RefTensor({2, 3}, {0, 0, 0, 0, 0, 0}));
  EXPECT_THROW(ShardOf(RefTensor(Shape{}, {1}), 0, 2), std::invalid_argument);
  EXPECT_THROW(ShardOf(full, 4, 4), std::invalid_argument);
}

TEST(ShardTest, MapsOnAllRanksRoundTrip) {
  const RefTensorMap full = {{"a", Iota({6, 4})}, {"b", Iota({7})}, {"c", Iota({1, 8})}};
  const std::vector<RefTensorMap> shards = ShardsOnAllRanks(full, 4);
  ASSERT_EQ(shards.size(), 4u);
  EXPECT_EQ(shards[3].at("a").shape, (Shape{0, 4}));
  EXPECT_EQ(shards[3].at("b"), RefTensor({1}, {6}));
  EXPECT_EQ(shards[1].at("c").shape, (Shape{0, 8}));
  EXPECT_EQ(UnshardFromShards(shards), full);
  const std::vector<RefTensorMap> padded = PaddedShardsOnAllRanks(full, 4);
  for (const RefTensorMap& m : padded) {
    EXPECT_EQ(m.at("a").shape, (Shape{2, 4}));
    EXPECT_EQ(m.at("b").shape, (Shape{2}));
    EXPECT_EQ(m.at("c").shape, (Shape{1, 8}));
  }
  // Gradient maps: absent gradients stay absent.
  const RefTensorMap grads = {{"b", Iota({7})}};
  EXPECT_EQ(ShardsOf(grads, 1, 4).size(), 1u);
}

TEST(ShardTest, FlatParameterShards) {
  // FSDP1: [a (2x2) | b (3)] = 0..6 over 2 ranks: c = 4 -> rank 0 [0..3], rank 1 [4..6] + pad.
  const RefTensorMap full = {{"a", Iota({2, 2})}, {"b", RefTensor({3}, {4, 5, 6})}};
  const std::vector<std::string> order = {"a", "b"};
  EXPECT_EQ(FlatShardOf(full, order, 0, 2), RefTensor({4}, {0, 1, 2, 3}));
  EXPECT_EQ(FlatShardOf(full, order, 1, 2), RefTensor({3}, {4, 5, 6}));
  EXPECT_EQ(FlatShardOf(full, order, 1, 2, /*padded=*/true), RefTensor({4}, {4, 5, 6, 0}));
  // Order matters: [b | a].
  EXPECT_EQ(FlatShardOf(full, {"b", "a"}, 0, 2), RefTensor({4}, {4, 5, 6, 0}));
  EXPECT_THROW(FlatShardOf(full, {"z"}, 0, 2), std::invalid_argument);
}

}  // namespace
}  // namespace fsdp::reference
