// ReduceInRankOrder against its definition ([Note: rank-order reduction] in
// docs/process_groups.md), written here as a plain element-by-element loop: element i is
// rank 0's value (times its factor for PREMUL_SUM) in the accumulator type (float for
// float32/float16/bfloat16, double for float64, int64 for int64), combined with rank 1's, rank
// 2's, ... in that order, divided by the world size for AVG, and rounded to the dtype once. The
// kernel works in vectorised blocks ([Note: vectorised rank-order reduction] in
// reduce_op.cc); its results must be bit-identical to the definition for every op, dtype and
// length (full blocks, a partial last block, shorter than a block), NaN propagation of MIN/MAX
// included, and when the output is one of the inputs.
#include "engine/distributed/reduce_op.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace fsdp::distributed {
namespace {

// The definition, one element at a time, in the accumulator type Acc.
template <typename Acc>
std::vector<double> DefinitionOf(ReduceOp op, const std::vector<std::vector<double>>& values,
                                 const std::vector<double>& factors) {
  const size_t numel = values[0].size();
  std::vector<double> out(numel);
  for (size_t i = 0; i < numel; ++i) {
    Acc acc = static_cast<Acc>(values[0][i]);
    if (op == ReduceOp::kPremulSum) acc = acc * static_cast<Acc>(factors[0]);
    for (size_t r = 1; r < values.size(); ++r) {
      const Acc x = static_cast<Acc>(values[r][i]);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc = acc + x;
          break;
        case ReduceOp::kPremulSum:
          acc = acc + x * static_cast<Acc>(factors[r]);
          break;
        case ReduceOp::kMin:  // NaN propagates (torch.minimum)
          if (!std::isnan(static_cast<double>(acc))) {
            acc = std::isnan(static_cast<double>(x)) || x < acc ? x : acc;
          }
          break;
        case ReduceOp::kMax:
          if (!std::isnan(static_cast<double>(acc))) {
            acc = std::isnan(static_cast<double>(x)) || x > acc ? x : acc;
          }
          break;
      }
    }
    if (op == ReduceOp::kAvg) acc = acc / static_cast<Acc>(values.size());
    out[i] = static_cast<double>(acc);  // exact: the dtype's rounding follows in from_doubles
  }
  return out;
}

std::vector<double> Definition(DType dtype, ReduceOp op,
                               const std::vector<std::vector<double>>& values,
                               const std::vector<double>& factors) {
  switch (dtype) {
    case DType::kFloat64:
      return DefinitionOf<double>(op, values, factors);
    case DType::kInt64:
      return DefinitionOf<int64_t>(op, values, factors);
    default:
      return DefinitionOf<float>(op, values, factors);
  }
}

// Rank `rank`'s input of `numel` elements in `dtype`: normal values (integers for int64), with
// NaNs at a few positions when `with_nans`.
Tensor InputOf(int rank, size_t numel, DType dtype, bool with_nans) {
  Generator gen(1000 + static_cast<uint64_t>(rank));
  std::vector<double> v = Tensor::randn({static_cast<int64_t>(numel)}, DType::kFloat64, &gen)
                              .to_doubles();
  for (size_t i = 0; i < numel; ++i) {
    if (dtype == DType::kInt64) v[i] = std::round(v[i] * 1000);
    if (with_nans && (i * 7 + static_cast<size_t>(rank) * 3) % 97 == 0) v[i] = NAN;
  }
  return Tensor::from_doubles(v, {static_cast<int64_t>(numel)}, dtype);
}

// Same bits, NaNs compared as NaN (their payloads are not part of the contract).
void ExpectSame(const std::vector<double>& actual, const std::vector<double>& expected,
                const std::string& where) {
  ASSERT_EQ(actual.size(), expected.size()) << where;
  size_t differing = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const bool both_nan = std::isnan(actual[i]) && std::isnan(expected[i]);
    if (!both_nan && std::memcmp(&actual[i], &expected[i], sizeof(double)) != 0) {
      if (differing++ < 3) {
        ADD_FAILURE() << where << ": element " << i << " is " << actual[i] << ", the definition "
                      << expected[i];
      }
    }
  }
  EXPECT_EQ(differing, 0u) << where;
}

TEST(ReduceInRankOrderTest, BitIdenticalToTheElementByElementDefinition) {
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                     ReduceOp::kMax, ReduceOp::kPremulSum};
  const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                     DType::kBFloat16, DType::kInt64};
  // Shorter than a block, exactly one, one more, and several blocks plus a partial one.
  const std::vector<size_t> numels = {1, 7, 1024, 1025, 3 * 1024 + 333};
  for (int ranks : {1, 2, 3, 8}) {
    for (DType dtype : dtypes) {
      for (ReduceOp op : ops) {
        if (!ReduceOpSupports(op, dtype)) continue;
        const bool nans = IsFloatingPoint(dtype) && (op == ReduceOp::kMin || op == ReduceOp::kMax);
        for (size_t numel : numels) {
          std::vector<Tensor> inputs;
          std::vector<const void*> ptrs;
          std::vector<std::vector<double>> values;
          std::vector<double> factors;
          for (int r = 0; r < ranks; ++r) {
            inputs.push_back(InputOf(r, numel, dtype, nans));
            ptrs.push_back(inputs.back().data_ptr());
            values.push_back(inputs.back().to_doubles());
            factors.push_back(0.5 + 0.37 * r);
          }
          const Tensor expected = Tensor::from_doubles(Definition(dtype, op, values, factors),
                                                       {static_cast<int64_t>(numel)}, dtype);
          const std::string where = std::string(DTypeName(dtype)) + " " + ReduceOpName(op) +
                                    " ranks " + std::to_string(ranks) + " numel " +
                                    std::to_string(numel);
          Tensor out = Tensor::empty({static_cast<int64_t>(numel)}, dtype);
          ReduceInRankOrder(dtype, op, ptrs, factors, out.data_ptr(), numel);
          ExpectSame(out.to_doubles(), expected.to_doubles(), where);
          // In place into the last input (an all-reduce's buffer): read before written.
          ReduceInRankOrder(dtype, op, ptrs, factors, inputs.back().data_ptr(), numel);
          ExpectSame(inputs.back().to_doubles(), expected.to_doubles(), where + " in place");
        }
      }
    }
  }
}

}  // namespace
}  // namespace fsdp::distributed
