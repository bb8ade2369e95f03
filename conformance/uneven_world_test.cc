// DiscriminatingWorld and the two splits it compares (conformance/uneven_world.h).
#include "conformance/uneven_world.h"

#include <gtest/gtest.h>

#include <memory>

#include "engine/nn/layers.h"
#include "engine/nn/module.h"

namespace fsdp::conformance {
namespace {

TEST(UnevenWorld, SplitsOfSevenRowsOverThreeRanks) {
  EXPECT_EQ(ChunkRowsPerRank(7, 3), (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(BalancedRowsPerRank(7, 3), (std::vector<int64_t>{3, 2, 2}));
  // torch.chunk leaves trailing ranks empty where a balanced split does not.
  EXPECT_EQ(ChunkRowsPerRank(6, 4), (std::vector<int64_t>{2, 2, 2, 0}));
  EXPECT_EQ(BalancedRowsPerRank(6, 4), (std::vector<int64_t>{2, 2, 1, 1}));
}

TEST(UnevenWorld, SplitsDifferExactlyForEnoughRowsWithARemainderNeitherZeroNorWorldMinusOne) {
  for (int world = 1; world <= 16; ++world) {
    for (int64_t n = 0; n <= 200; ++n) {
      int64_t total = 0;
      for (int64_t rows : BalancedRowsPerRank(n, world)) total += rows;
      ASSERT_EQ(total, n);
      const int64_t rem = n % world;
      EXPECT_EQ(ChunkDiffersFromBalanced(n, world), n >= world && rem != 0 && rem != world - 1)
          << n << " rows over " << world;
    }
  }
}

TEST(UnevenWorld, PicksTheWorldWhereMostSizesDiffer) {
  EXPECT_EQ(DiscriminatingWorld({16, 64}, 8), 3);  // 16 % 3 == 64 % 3 == 1
  EXPECT_EQ(DiscriminatingWorld({8, 32}, 8), 5);   // % 3 == 2 for both; % 5: 3 and 2
  EXPECT_EQ(DiscriminatingWorld({24}, 8), 7);      // 24 % 5 == 4 == 5 - 1; 24 % 7 == 3
  EXPECT_EQ(DiscriminatingWorld({1, 2}, 8), 0);    // fewer rows than ranks at every world >= 3
  EXPECT_EQ(DiscriminatingWorld({24}, 2), 0);
}

TEST(UnevenWorld, CountsWhatFsdpShards) {
  auto root = std::make_shared<nn::Sequential>();
  auto a = std::make_shared<nn::Linear>(4, 5);  // weight [5, 4], bias [5]
  auto b = std::make_shared<nn::Linear>(5, 3);  // weight [3, 5], bias [3]
  root->append(a);
  root->append(b);
  EXPECT_EQ(ParameterDim0Sizes(*root), (std::vector<int64_t>{5, 5, 3, 3}));
  EXPECT_EQ(FlatParameterNumels(*root, {a}), (std::vector<int64_t>{25, 18}));
  EXPECT_EQ(FlatParameterNumels(*root, {}), (std::vector<int64_t>{43}));
}

}  // namespace
}  // namespace fsdp::conformance
