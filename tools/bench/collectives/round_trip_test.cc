// Every registered pg-bench collective (registry.h) round-trips through its own descriptor:
// fill every rank's input, run the collective on a world of threaded ranks
// (fakes::RunRanks), and the descriptor's check finds 0 wrong elements on every rank; a
// corrupted output gives > 0. A new descriptor is covered by this test as soon as it is in the
// list.
// Thread-safety: each rank uses its own buffers; the descriptors are stateless.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fakes/run_ranks.h"
#include "tools/bench/collective_descriptor.h"
#include "tools/bench/collectives/registry.h"

namespace fsdp::bench {
namespace {

// What one rank saw: wrong elements of its real output, then of a corrupted copy of it.
struct RoundTrip {
  int64_t wrong = -1;
  int64_t corrupted_wrong = -1;
};

// The reduce ops to try: one (ignored) for a collective that does not reduce.
std::vector<distributed::ReduceOp> RedOpsFor(const CollectiveDescriptor& c, DType dtype) {
  if (!c.reduces) return {distributed::ReduceOp::kSum};
  std::vector<distributed::ReduceOp> ops = {distributed::ReduceOp::kSum,
                                            distributed::ReduceOp::kMin,
                                            distributed::ReduceOp::kMax};
  if (IsFloatingPoint(dtype)) ops.push_back(distributed::ReduceOp::kAvg);
  return ops;
}

TEST(PgBenchCollectivesTest, RegistryIsNonEmptyWithUniqueNamesAndCompleteDescriptors) {
  ASSERT_FALSE(AllCollectives().empty());
  std::vector<std::string> names;
  for (const CollectiveDescriptor* c : AllCollectives()) {
    ASSERT_NE(c, nullptr);
    SCOPED_TRACE(c->name);
    EXPECT_NE(std::string(c->name), "");
    EXPECT_NE(NormalizedName(c->name), "all");  // `-o all` means every collective
    for (const std::string& other : names) {
      EXPECT_NE(NormalizedName(other), NormalizedName(c->name));
    }
    names.push_back(c->name);
    EXPECT_NE(c->bus_factor, nullptr);
    EXPECT_NE(c->counts, nullptr);
    EXPECT_NE(c->fill, nullptr);
    EXPECT_NE(c->check, nullptr);
    EXPECT_NE(c->run, nullptr);
    EXPECT_EQ(&FindCollective(c->name), c);
  }
}

TEST(PgBenchCollectivesTest, EveryCollectiveRoundTripsOnThreadedRanks) {
  for (const CollectiveDescriptor* collective : AllCollectives()) {
    const CollectiveDescriptor& c = *collective;
    for (int world : {1, 2, 3, 4}) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
        for (distributed::ReduceOp redop : RedOpsFor(c, dtype)) {
          SCOPED_TRACE(std::string(c.name) + " world " + std::to_string(world) + " " +
                       DTypeName(dtype) + " " + RedOpName(redop));
          // 37 elements per rank: not a multiple of the check data's period.
          const int64_t bytes = static_cast<int64_t>(ElementSize(dtype)) * world * 37;
          const CollectiveCounts counts = ComputeCounts(c, bytes, dtype, world);
          ASSERT_GT(counts.per_rank_numel, 0);
          auto results = fakes::RunRanks(world, [&](fakes::RankEnv& env) {
            CollectiveBuffers buffers = AllocateBuffers(c, counts, dtype, Device::CPU());
            FillCheckInput(c, buffers.input, counts, env.rank, world);
            RunCollective(c, *env.pg, buffers, redop);
            RoundTrip out;
            out.wrong = CountWrongElements(c, redop, buffers.output, counts, env.rank, world);
            // Values no result can have (|result| <= 8 * world), at both ends of the output.
            std::vector<double> values = buffers.output.to_doubles();
            values.front() = -3000;
            values.back() = 3000;
            const Tensor bad =
                Tensor::from_doubles(values, {static_cast<int64_t>(values.size())}, dtype);
            out.corrupted_wrong = CountWrongElements(c, redop, bad, counts, env.rank, world);
            return out;
          });
          ASSERT_TRUE(results.all_ok()) << results.summary();
          for (const auto& r : results) {
            EXPECT_EQ(r.value->wrong, 0) << "rank " << r.rank;
            EXPECT_GT(r.value->corrupted_wrong, 0) << "rank " << r.rank;
          }
        }
      }
    }
  }
}

TEST(PgBenchCollectivesTest, CountsAreConsistent) {
  for (const CollectiveDescriptor* c : AllCollectives()) {
    for (int world : {1, 3, 8}) {
      for (int64_t bytes : {int64_t{0}, int64_t{7}, int64_t{1000}, int64_t{1} << 20}) {
        SCOPED_TRACE(std::string(c->name) + " world " + std::to_string(world) + " bytes " +
                     std::to_string(bytes));
        const CollectiveCounts counts = ComputeCounts(*c, bytes, DType::kFloat32, world);
        EXPECT_LE(counts.bytes, bytes);
        EXPECT_EQ(counts.bytes, counts.count * 4);
        EXPECT_GE(counts.input_numel, counts.per_rank_numel);
        EXPECT_GE(counts.output_numel, counts.per_rank_numel);
        if (c->in_place) EXPECT_EQ(counts.input_numel, counts.output_numel);
        EXPECT_GE(BusBandwidthFactor(*c, world), 0.0);
      }
    }
  }
}

}  // namespace
}  // namespace fsdp::bench
