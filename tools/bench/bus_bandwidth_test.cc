#include "tools/bench/bus_bandwidth.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "tools/bench/collectives/registry.h"

namespace fsdp::bench {
namespace {

const CollectiveDescriptor& kAllGather = FindCollective("all_gather");
const CollectiveDescriptor& kReduceScatter = FindCollective("reduce_scatter");
const CollectiveDescriptor& kAllReduce = FindCollective("all_reduce");
const CollectiveDescriptor& kBroadcast = FindCollective("broadcast");

TEST(BusBandwidthTest, FactorsFollowNcclTests) {
  for (int n : {1, 2, 3, 8, 128}) {
    const double ring = static_cast<double>(n - 1) / n;
    EXPECT_DOUBLE_EQ(RingFactor(n), ring) << n;
    EXPECT_DOUBLE_EQ(BusBandwidthFactor(kAllGather, n), ring) << n;
    EXPECT_DOUBLE_EQ(BusBandwidthFactor(kReduceScatter, n), ring) << n;
    EXPECT_DOUBLE_EQ(BusBandwidthFactor(kAllReduce, n), 2 * ring) << n;
    EXPECT_DOUBLE_EQ(BusBandwidthFactor(kBroadcast, n), 1.0) << n;
  }
  for (const CollectiveDescriptor* c : AllCollectives()) {
    EXPECT_THROW(BusBandwidthFactor(*c, 0), Error) << c->name;
  }
  EXPECT_THROW(RingFactor(0), Error);
}

TEST(BusBandwidthTest, AlgBandwidthIsBytesPerSecondInGB) {
  EXPECT_DOUBLE_EQ(AlgBandwidthGBps(2'000'000'000, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(AlgBandwidthGBps(1'000'000, 1e-3), 1.0);
  EXPECT_EQ(AlgBandwidthGBps(1024, 0.0), 0.0);
}

TEST(BusBandwidthTest, CountsUseTheFullArrayAndSplitEvenly) {
  // all_gather: size is the output; each rank contributes count / n.
  auto ag = ComputeCounts(kAllGather, 1024, DType::kFloat32, 4);
  EXPECT_EQ(ag.count, 256);
  EXPECT_EQ(ag.bytes, 1024);
  EXPECT_EQ(ag.input_numel, 64);
  EXPECT_EQ(ag.output_numel, 256);
  // reduce_scatter: size is the input.
  auto rs = ComputeCounts(kReduceScatter, 1024, DType::kFloat64, 4);
  EXPECT_EQ(rs.count, 128);
  EXPECT_EQ(rs.input_numel, 128);
  EXPECT_EQ(rs.output_numel, 32);
  // Rounded down to a multiple of the world size (1024 B of float on 3 ranks: 255 elements).
  auto odd = ComputeCounts(kAllGather, 1024, DType::kFloat32, 3);
  EXPECT_EQ(odd.count, 255);
  EXPECT_EQ(odd.bytes, 1020);
  EXPECT_EQ(odd.per_rank_numel, 85);
  // all_reduce / broadcast do not split.
  auto ar = ComputeCounts(kAllReduce, 1000, DType::kFloat16, 3);
  EXPECT_EQ(ar.count, 500);
  EXPECT_EQ(ar.input_numel, 500);
  EXPECT_EQ(ar.output_numel, 500);
  auto bc = ComputeCounts(kBroadcast, 7, DType::kInt64, 2);
  EXPECT_EQ(bc.count, 0);
  // Too small to give every rank an element.
  EXPECT_EQ(ComputeCounts(kAllGather, 1024, DType::kFloat32, 512).per_rank_numel, 0);
  EXPECT_THROW(ComputeCounts(kAllGather, 1024, DType::kFloat32, 0), Error);
  EXPECT_THROW(ComputeCounts(kAllReduce, -1, DType::kFloat32, 2), Error);
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
  for (const CollectiveDescriptor* op : AllCollectives()) {
    EXPECT_EQ(ParseCollectives(op->name), std::vector<const CollectiveDescriptor*>{op});
  }
  EXPECT_EQ(ParseCollectives("allreduce"), std::vector<const CollectiveDescriptor*>{&kAllReduce});
  EXPECT_EQ(ParseCollectives("All-Gather"),
            std::vector<const CollectiveDescriptor*>{&kAllGather});
  EXPECT_EQ(ParseCollectives("all"), AllCollectives());
  EXPECT_EQ(AllCollectives(), (std::vector<const CollectiveDescriptor*>{
                                  &kAllGather, &kReduceScatter, &kAllReduce, &kBroadcast}));
  EXPECT_EQ(CollectiveNames(" or "), "all_gather, reduce_scatter, all_reduce or broadcast");
  EXPECT_THROW(ParseCollectives("alltoall"), Error);

  for (DType d :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt64}) {
    EXPECT_EQ(ParseBenchDType(NcclTypeName(d)), d);
    EXPECT_EQ(ParseBenchDType(DTypeName(d)), d);
  }
  EXPECT_EQ(ParseBenchDType("fp16"), DType::kFloat16);
  EXPECT_THROW(ParseBenchDType("int8"), Error);

  for (auto op :
       {distributed::ReduceOp::kSum, distributed::ReduceOp::kAvg, distributed::ReduceOp::kMin, distributed::ReduceOp::kMax}) {
    EXPECT_EQ(ParseRedOp(RedOpName(op)), op);
  }
  EXPECT_EQ(ParseRedOp("SUM"), distributed::ReduceOp::kSum);
  EXPECT_THROW(ParseRedOp("prod"), Error);
  EXPECT_TRUE(kAllReduce.reduces);
  EXPECT_TRUE(kReduceScatter.reduces);
  EXPECT_FALSE(kBroadcast.reduces);
  EXPECT_FALSE(kAllGather.reduces);
  EXPECT_EQ(kBroadcast.root, 0);
  EXPECT_EQ(kAllGather.root, -1);
  EXPECT_TRUE(kAllReduce.in_place);
  EXPECT_TRUE(kBroadcast.in_place);
  EXPECT_FALSE(kAllGather.in_place);
  EXPECT_FALSE(kReduceScatter.in_place);
}

}  // namespace
}  // namespace fsdp::bench
