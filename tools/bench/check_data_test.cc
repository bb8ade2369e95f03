#include "tools/bench/check_data.h"

#include <gtest/gtest.h>

#include <cstring>

#include "engine/dist/reduce_op.h"

namespace fsdp::bench {
namespace {

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                             DType::kInt64};

TEST(CheckDataTest, BoundKeepsEverySumExact) {
  const struct {
    DType dtype;
    int64_t exact;
  } cases[] = {{DType::kFloat32, int64_t{1} << 24},
               {DType::kFloat64, int64_t{1} << 53},
               {DType::kFloat16, 2048},
               {DType::kBFloat16, 256},
               {DType::kInt64, int64_t{1} << 62}};
  for (const auto& c : cases) {
    for (int world : {1, 2, 3, 8, 100, 128, 300}) {
      const int64_t m = CheckValueBound(c.dtype, world);
      EXPECT_LE(m, 8);
      EXPECT_GE(m, 0);
      EXPECT_LE(world * m, c.exact) << DTypeName(c.dtype) << " world " << world;
      // Maximal: one more would break exactness or exceed 8.
      EXPECT_TRUE(m == 8 || world * (m + 1) > c.exact) << DTypeName(c.dtype) << " " << world;
    }
  }
  EXPECT_EQ(CheckValueBound(DType::kBFloat16, 128), 2);
  EXPECT_EQ(CheckValueBound(DType::kFloat16, 128), 8);
}

TEST(CheckDataTest, ValuesDependOnRankAndIndexAndStayInBounds) {
  const int64_t m = 3;
  bool rank_matters = false;
  for (int r = 0; r < 4; ++r) {
    for (int64_t j = 0; j < 20; ++j) {
      const int64_t v = CheckValue(r, j, m);
      EXPECT_GE(v, -m);
      EXPECT_LE(v, m);
      rank_matters = rank_matters || v != CheckValue(0, j, m);
    }
  }
  EXPECT_TRUE(rank_matters);
  EXPECT_EQ(CheckValue(5, 7, 0), 0);
}

// What each rank's output should be, computed with the engine's reference reduction kernel
// (independent of check_data's tabulated expectations).
std::vector<Tensor> Simulate(BenchCollective op, dist::ReduceOp redop,
                             const std::vector<Tensor>& inputs, const CollectiveCounts& counts) {
  const int world = static_cast<int>(inputs.size());
  const DType dtype = inputs[0].dtype();
  std::vector<Tensor> outputs;
  Tensor reduced;
  if (IsReduction(op)) {
    reduced = Tensor::zeros({counts.count}, dtype);
    std::vector<const void*> ptrs;
    for (const auto& t : inputs) ptrs.push_back(t.data_ptr());
    dist::ReduceInRankOrder(dtype, redop, ptrs, std::vector<double>(world, 1.0), reduced.data_ptr(),
                            static_cast<size_t>(counts.count));
  }
  for (int r = 0; r < world; ++r) {
    Tensor out = Tensor::zeros({counts.output_numel}, dtype);
    const size_t elem = ElementSize(dtype);
    auto* dst = static_cast<char*>(out.data_ptr());
    switch (op) {
      case BenchCollective::kAllGather:
        for (int q = 0; q < world; ++q) {
          std::memcpy(dst + q * counts.per_rank_numel * elem, inputs[q].data_ptr(),
                      counts.per_rank_numel * elem);
        }
        break;
      case BenchCollective::kReduceScatter:
        std::memcpy(dst, static_cast<char*>(reduced.data_ptr()) + r * counts.per_rank_numel * elem,
                    counts.per_rank_numel * elem);
        break;
      case BenchCollective::kAllReduce:
        std::memcpy(dst, reduced.data_ptr(), counts.count * elem);
        break;
      case BenchCollective::kBroadcast:
        std::memcpy(dst, inputs[0].data_ptr(), counts.count * elem);
        break;
    }
    outputs.push_back(out);
  }
  return outputs;
}

TEST(CheckDataTest, CorrectResultsVerifyAndCorruptionIsCounted) {
  for (DType dtype : kDTypes) {
    for (int world : {1, 3, 8, 128}) {
      for (BenchCollective op : AllBenchCollectives()) {
        std::vector<dist::ReduceOp> redops = {dist::ReduceOp::kSum};
        if (IsReduction(op)) {
          redops = {dist::ReduceOp::kSum, dist::ReduceOp::kMin, dist::ReduceOp::kMax};
          if (IsFloatingPoint(dtype)) redops.push_back(dist::ReduceOp::kAvg);
        }
        for (dist::ReduceOp redop : redops) {
          SCOPED_TRACE(std::string(DTypeName(dtype)) + " world " + std::to_string(world) + " " +
                       BenchCollectiveName(op) + " " + RedOpName(redop));
          const auto counts = ComputeCounts(
              op, static_cast<int64_t>(ElementSize(dtype)) * world * 37, dtype, world);
          std::vector<Tensor> inputs;
          for (int r = 0; r < world; ++r) {
            inputs.push_back(Tensor::zeros({counts.input_numel}, dtype));
            FillCheckInput(op, inputs.back(), counts, r, world);
          }
          const auto outputs = Simulate(op, redop, inputs, counts);
          for (int r = 0; r < world; r += std::max(1, world / 4)) {
            ASSERT_EQ(CountWrongElements(op, redop, outputs[r], counts, r, world), 0)
                << "rank " << r;
          }
          // Corrupt two elements of the last rank's output (to values no result can have:
          // |result| <= 8 * world).
          Tensor bad = outputs[world - 1].clone();
          const auto values = bad.to_doubles();
          std::vector<double> changed = values;
          changed[0] = -3000;
          changed[changed.size() - 1] = 3000;
          bad.copy_(Tensor::from_doubles(changed, {bad.numel()}, DType::kFloat64));
          const int64_t expect_wrong = bad.numel() == 1 ? 1 : 2;
          EXPECT_EQ(CountWrongElements(op, redop, bad, counts, world - 1, world), expect_wrong);
        }
      }
    }
  }
}

TEST(CheckDataTest, RejectsTensorsOfTheWrongSize) {
  const auto counts = ComputeCounts(BenchCollective::kAllGather, 64, DType::kFloat32, 2);
  EXPECT_THROW(FillCheckInput(BenchCollective::kAllGather, Tensor::zeros({3}), counts, 0, 2),
               Error);
  EXPECT_THROW(CountWrongElements(BenchCollective::kAllGather, dist::ReduceOp::kSum,
                                  Tensor::zeros({3}), counts, 0, 2),
               Error);
}

}  // namespace
}  // namespace fsdp::bench
