#include "tools/bench/check_data.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>

#include "engine/distributed/reduce_op.h"
#include "tools/bench/collective_descriptor.h"
#include "tools/bench/collectives/registry.h"

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
// (independent of check_data's tabulated expectations), for the collectives this test knows;
// nullopt for others (pg_bench_collectives_test.cc runs every registered collective on real
// ranks).
std::optional<std::vector<Tensor>> Simulate(const CollectiveDescriptor& op,
                                            distributed::ReduceOp redop,
                                            const std::vector<Tensor>& inputs,
                                            const CollectiveCounts& counts) {
  const std::string name = op.name;
  if (name != "all_gather" && name != "reduce_scatter" && name != "all_reduce" &&
      name != "broadcast") {
    return std::nullopt;
  }
  const int world = static_cast<int>(inputs.size());
  const DType dtype = inputs[0].dtype();
  std::vector<Tensor> outputs;
  Tensor reduced;
  if (op.reduces) {
    reduced = Tensor::zeros({counts.count}, dtype);
    std::vector<const void*> ptrs;
    for (const auto& t : inputs) ptrs.push_back(t.data_ptr());
    distributed::ReduceInRankOrder(dtype, redop, ptrs, std::vector<double>(world, 1.0), reduced.data_ptr(),
                            static_cast<size_t>(counts.count));
  }
  for (int r = 0; r < world; ++r) {
    Tensor out = Tensor::zeros({counts.output_numel}, dtype);
    const size_t elem = ElementSize(dtype);
    auto* dst = static_cast<char*>(out.data_ptr());
    if (name == "all_gather") {
      for (int q = 0; q < world; ++q) {
        std::memcpy(dst + q * counts.per_rank_numel * elem, inputs[q].data_ptr(),
                    counts.per_rank_numel * elem);
      }
    } else if (name == "reduce_scatter") {
      std::memcpy(dst, static_cast<char*>(reduced.data_ptr()) + r * counts.per_rank_numel * elem,
                  counts.per_rank_numel * elem);
    } else if (name == "all_reduce") {
      std::memcpy(dst, reduced.data_ptr(), counts.count * elem);
    } else {  // broadcast from rank 0
      std::memcpy(dst, inputs[0].data_ptr(), counts.count * elem);
    }
    outputs.push_back(out);
  }
  return outputs;
}

TEST(CheckDataTest, CorrectResultsVerifyAndCorruptionIsCounted) {
  for (DType dtype : kDTypes) {
    for (int world : {1, 3, 8, 128}) {
      for (const CollectiveDescriptor* collective : AllCollectives()) {
        const CollectiveDescriptor& op = *collective;
        std::vector<distributed::ReduceOp> redops = {distributed::ReduceOp::kSum};
        if (op.reduces) {
          redops = {distributed::ReduceOp::kSum, distributed::ReduceOp::kMin, distributed::ReduceOp::kMax};
          if (IsFloatingPoint(dtype)) redops.push_back(distributed::ReduceOp::kAvg);
        }
        for (distributed::ReduceOp redop : redops) {
          SCOPED_TRACE(std::string(DTypeName(dtype)) + " world " + std::to_string(world) + " " +
                       op.name + " " + RedOpName(redop));
          const auto counts = ComputeCounts(
              op, static_cast<int64_t>(ElementSize(dtype)) * world * 37, dtype, world);
          std::vector<Tensor> inputs;
          for (int r = 0; r < world; ++r) {
            inputs.push_back(Tensor::zeros({counts.input_numel}, dtype));
            FillCheckInput(op, inputs.back(), counts, r, world);
          }
          const auto simulated = Simulate(op, redop, inputs, counts);
          if (!simulated) continue;
          const std::vector<Tensor>& outputs = *simulated;
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
  for (const CollectiveDescriptor* op : AllCollectives()) {
    const auto counts = ComputeCounts(*op, 64, DType::kFloat32, 2);
    EXPECT_THROW(FillCheckInput(*op, Tensor::zeros({3}), counts, 0, 2), Error) << op->name;
    EXPECT_THROW(CountWrongElements(*op, distributed::ReduceOp::kSum, Tensor::zeros({3}), counts,
                                    0, 2),
                 Error)
        << op->name;
  }
}

}  // namespace
}  // namespace fsdp::bench
