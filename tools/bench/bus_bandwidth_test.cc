#include "tools/bench/bus_bandwidth.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace fsdp::bench {
namespace {

TEST(BusBandwidthTest, FactorsFollowNcclTests) {
  for (int n : {1, 2, 3, 8, 128}) {
    const double ring = static_cast<double>(n - 1) / n;
    EXPECT_DOUBLE_EQ(BusBandwidthFactor(BenchCollective::kAllGather, n), ring) << n;
    EXPECT_DOUBLE_EQ(BusBandwidthFactor(BenchCollective::kReduceScatter, n), ring) << n;
    EXPECT_DOUBLE_EQ(BusBandwidthFactor(BenchCollective::kAllReduce, n), 2 * ring) << n;
    EXPECT_DOUBLE_EQ(BusBandwidthFactor(BenchCollective::kBroadcast, n), 1.0) << n;
  }
  EXPECT_THROW(BusBandwidthFactor(BenchCollective::kAllReduce, 0), Error);
}

TEST(BusBandwidthTest, AlgBandwidthIsBytesPerSecondInGB) {
  EXPECT_DOUBLE_EQ(AlgBandwidthGBps(2'000'000'000, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(AlgBandwidthGBps(1'000'000, 1e-3), 1.0);
  EXPECT_EQ(AlgBandwidthGBps(1024, 0.0), 0.0);
}

TEST(BusBandwidthTest, CountsUseTheFullArrayAndSplitEvenly) {
  // all_gather: size is the output; each rank contributes count / n.
  auto ag = ComputeCounts(BenchCollective::kAllGather, 1024, DType::kFloat32, 4);
  EXPECT_EQ(ag.count, 256);
  EXPECT_EQ(ag.bytes, 1024);
  EXPECT_EQ(ag.input_numel, 64);
  EXPECT_EQ(ag.output_numel, 256);
  // reduce_scatter: size is the input.
  auto rs = ComputeCounts(BenchCollective::kReduceScatter, 1024, DType::kFloat64, 4);
  EXPECT_EQ(rs.count, 128);
  EXPECT_EQ(rs.input_numel, 128);
  EXPECT_EQ(rs.output_numel, 32);
  // Rounded down to a multiple of the world size (1024 B of float on 3 ranks: 255 elements).
  auto odd = ComputeCounts(BenchCollective::kAllGather, 1024, DType::kFloat32, 3);
  EXPECT_EQ(odd.count, 255);
  EXPECT_EQ(odd.bytes, 1020);
  EXPECT_EQ(odd.per_rank_numel, 85);
  // all_reduce / broadcast do not split.
  auto ar = ComputeCounts(BenchCollective::kAllReduce, 1000, DType::kFloat16, 3);
  EXPECT_EQ(ar.count, 500);
  EXPECT_EQ(ar.input_numel, 500);
  EXPECT_EQ(ar.output_numel, 500);
  auto bc = ComputeCounts(BenchCollective::kBroadcast, 7, DType::kInt64, 2);
  EXPECT_EQ(bc.count, 0);
  // Too small to give every rank an element.
  EXPECT_EQ(ComputeCounts(BenchCollective::kAllGather, 1024, DType::kFloat32, 512).per_rank_numel,
            0);
}

TEST(BusBandwidthTest, SizeSweepMultipliesOrSteps) {
  EXPECT_EQ(SizeSweep(1024, 65536, 4, 0), (std::vector<int64_t>{1024, 4096, 16384, 65536}));
  EXPECT_EQ(SizeSweep(1024, 10000, 4, 0), (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(SizeSweep(100, 400, 1, 100), (std::vector<int64_t>{100, 200, 300, 400}));
  EXPECT_EQ(SizeSweep(8, 8, 2, 0), (std::vector<int64_t>{8}));
  EXPECT_EQ(SizeSweep(8, 8, 1, 0), (std::vector<int64_t>{8}));
  EXPECT_THROW(SizeSweep(16, 8, 2, 0), Error);
  EXPECT_THROW(SizeSweep(0, 8, 2, 0), Error);
  EXPECT_THROW(SizeSweep(1, 8, 1, 0), Error);
  // No overflow near the top of int64.
  const int64_t big = int64_t{1} << 62;
  EXPECT_EQ(SizeSweep(big / 2, big, 2, 0).size(), 2u);
}

TEST(BusBandwidthTest, NamesParseBothWays) {
  for (BenchCollective op : AllBenchCollectives()) {
    EXPECT_EQ(ParseBenchCollectives(BenchCollectiveName(op)), std::vector<BenchCollective>{op});
  }
  EXPECT_EQ(ParseBenchCollectives("allreduce"),
            std::vector<BenchCollective>{BenchCollective::kAllReduce});
  EXPECT_EQ(ParseBenchCollectives("all").size(), 4u);
  EXPECT_THROW(ParseBenchCollectives("alltoall"), Error);

  for (DType d :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt64}) {
    EXPECT_EQ(ParseBenchDType(NcclTypeName(d)), d);
    EXPECT_EQ(ParseBenchDType(DTypeName(d)), d);
  }
  EXPECT_EQ(ParseBenchDType("fp16"), DType::kFloat16);
  EXPECT_THROW(ParseBenchDType("int8"), Error);

  for (auto op :
       {dist::ReduceOp::kSum, dist::ReduceOp::kAvg, dist::ReduceOp::kMin, dist::ReduceOp::kMax}) {
    EXPECT_EQ(ParseRedOp(RedOpName(op)), op);
  }
  EXPECT_EQ(ParseRedOp("SUM"), dist::ReduceOp::kSum);
  EXPECT_THROW(ParseRedOp("prod"), Error);
  EXPECT_TRUE(IsReduction(BenchCollective::kAllReduce));
  EXPECT_FALSE(IsReduction(BenchCollective::kBroadcast));
  EXPECT_EQ(BenchRoot(BenchCollective::kBroadcast), 0);
  EXPECT_EQ(BenchRoot(BenchCollective::kAllGather), -1);
}

}  // namespace
}  // namespace fsdp::bench
