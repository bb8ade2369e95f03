// The collective test data of collective_data.h keep their promises at worlds 2..16 and 128,
// for every dtype of the scenarios and every reduce op whose result they check, at the
// scenarios' default counts (reduce_scatter_tensor: world chunks of 7; all_reduce: 7):
//   * exact: every input, every partial sum in any order (premultiplied or not) and every
//     result is an integer (or, for AVG, the quotient) that the dtype holds exactly;
//   * every op's result differs from every other op's, at every element;
//   * a dropped or a duplicated rank contribution changes every reduction (MIN and MAX over a
//     whole reduce-scatter, where each rank is at least once the only extreme);
//   * reduce-scatter chunks (what each rank receives) differ, so a chunk delivered to the
//     wrong rank shows; gathered blocks differ per rank; PREMUL_SUM factors applied to the
//     wrong ranks, or dropped for the first or the last rank, show.
// Reductions are recomputed here from the per-rank contributions with Reduce (exact double
// arithmetic), so each property is checked on the data, not assumed from the rule.
#include "conformance/collective_data.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::conformance {
namespace {

using distributed::ReduceOp;

constexpr int64_t kCount = 7;  // the scenarios' default count
const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                    DType::kBFloat16, DType::kInt64};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kPremulSum};

std::string Name(ReduceOp op) { return distributed::ReduceOpName(op); }

// `values` after a round trip through `dtype`.
std::vector<double> RoundTrip(const std::vector<double>& values, DType dtype) {
  return Tensor::from_doubles(values, {static_cast<int64_t>(values.size())}, dtype).to_doubles();
}

// The largest M (up to 2^16) such that every integer in [-M, M] is exact in `dtype` (2^16
// stands for "far more than the data need" in float32, float64 and int64).
int64_t LargestExactInteger(DType dtype) {
  constexpr int64_t kCap = int64_t{1} << 16;
  std::vector<double> all(kCap + 1);
  for (int64_t k = 0; k <= kCap; ++k) all[k] = static_cast<double>(k);
  const std::vector<double> back = RoundTrip(all, dtype);
  int64_t m = 0;
  while (m < kCap && back[m + 1] == all[m + 1]) ++m;
  return m;
}

// A reduction input and what the scenario makes of it: the two layouts of the scenarios.
struct Data {
  std::string what;
  ReduceLayout layout;
  int64_t numel = 0;
  // values[i][r]: element i of rank r's input.
  std::vector<std::vector<double>> values;
  std::vector<double> factors;  // per rank

  Data(std::string name, int world, int64_t chunks) : what(std::move(name)) {
    layout = {world, kCount};
    numel = chunks * kCount;
    values.assign(static_cast<size_t>(numel), std::vector<double>(static_cast<size_t>(world)));
    for (int r = 0; r < world; ++r) {
      factors.push_back(PremulFactor(r, world));
      for (int64_t i = 0; i < numel; ++i) values[i][r] = ReduceInput(layout, r, i);
    }
  }
  int world() const { return layout.world; }
  double Result(ReduceOp op, int64_t i) const { return Reduce(op, values[i], factors, world()); }
};

Data ReduceScatterData(int world) { return Data("reduce_scatter_tensor", world, world); }
Data AllReduceData(int world) { return Data("all_reduce", world, 1); }

// The ops whose results show a dropped or duplicated rank: every op over a whole
// reduce-scatter; over all_reduce's 7 elements MIN and MAX cannot (an element has one extreme
// rank, so 7 elements cannot name every rank of a larger world).
std::vector<ReduceOp> SensitiveOps(const Data& data) {
  if (data.numel == data.world() * kCount) return kOps;
  return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum};
}

// True when some element's `op` result differs once rank contributions are changed by
// `mutate(values, factors)`.
template <typename Mutate>
bool Changes(const Data& data, ReduceOp op, Mutate mutate) {
  std::vector<double> values, factors;
  for (int64_t i = 0; i < data.numel; ++i) {
    values.assign(data.values[i].begin(), data.values[i].end());
    factors.assign(data.factors.begin(), data.factors.end());
    mutate(values, factors);
    if (Reduce(op, values, factors, data.world()) != data.Result(op, i)) return true;
  }
  return false;
}

class CollectiveDataTest : public testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

TEST_P(CollectiveDataTest, InputsPartialSumsAndResultsAreExactInEveryDtype) {
  for (const Data& data : {ReduceScatterData(world()), AllReduceData(world())}) {
    // Integers of one sign per element: every partial sum, in any order, lies between the
    // element's sum of negative and sum of positive terms, and is an integer.
    int64_t largest_partial = 0;
    int64_t largest_premul_partial = 0;
    for (int64_t i = 0; i < data.numel; ++i) {
      double positive = 0, negative = 0, premul_positive = 0, premul_negative = 0;
      for (int r = 0; r < world(); ++r) {
        const double v = data.values[i][r];
        const double f = data.factors[r];
        ASSERT_EQ(v, std::round(v)) << data.what << " rank " << r << " element " << i;
        ASSERT_EQ(f, std::round(f)) << "factor of rank " << r;
        ASSERT_EQ(std::fmod(f, 2.0), 0.0) << "factor of rank " << r;
        (v > 0 ? positive : negative) += v;
        (v * f > 0 ? premul_positive : premul_negative) += v * f;
      }
      largest_partial = std::max<int64_t>(
          {largest_partial, static_cast<int64_t>(positive), static_cast<int64_t>(-negative)});
      largest_premul_partial = std::max<int64_t>(
          {largest_premul_partial, static_cast<int64_t>(premul_positive),
           static_cast<int64_t>(-premul_negative)});
    }
    // Premultiplied terms are even (every factor is), so their partial sums are the even
    // integers up to the largest.
    std::vector<double> evens;
    for (int64_t k = 0; k <= largest_premul_partial; k += 2) evens.push_back(static_cast<double>(k));
    for (DType dtype : kDTypes) {
      SCOPED_TRACE(data.what + " " + DTypeName(dtype) + " world " + std::to_string(world()));
      EXPECT_LE(largest_partial, LargestExactInteger(dtype));
      EXPECT_EQ(RoundTrip(evens, dtype), evens) << "premultiplied partial sums up to "
                                                << largest_premul_partial;
      for (ReduceOp op : kOps) {
        if (ReductionIsRejected(op, dtype)) continue;
        std::vector<double> results;
        for (int64_t i = 0; i < data.numel; ++i) results.push_back(data.Result(op, i));
        EXPECT_EQ(RoundTrip(results, dtype), results) << Name(op);
      }
    }
  }
  for (DType dtype : kDTypes) {
    for (int r = 0; r < world(); ++r) {
      const std::vector<double> gathered = GatherValues(r, 3 * kCount);
      ASSERT_EQ(RoundTrip(gathered, dtype), gathered) << DTypeName(dtype) << " rank " << r;
    }
  }
}

TEST_P(CollectiveDataTest, EveryOpGivesADifferentResultAtEveryElement) {
  for (const Data& data : {ReduceScatterData(world()), AllReduceData(world())}) {
    for (DType dtype : kDTypes) {
      for (int64_t i = 0; i < data.numel; ++i) {
        std::set<double> seen;
        int ops = 0;
        for (ReduceOp op : kOps) {
          if (ReductionIsRejected(op, dtype)) continue;
          ++ops;
          seen.insert(RoundTrip({data.Result(op, i)}, dtype)[0]);
        }
        ASSERT_EQ(seen.size(), static_cast<size_t>(ops))
            << data.what << " " << DTypeName(dtype) << " world " << world() << " element " << i;
      }
    }
  }
}

TEST_P(CollectiveDataTest, ADroppedRankChangesEveryReduction) {
  for (const Data& data : {ReduceScatterData(world()), AllReduceData(world())}) {
    for (ReduceOp op : SensitiveOps(data)) {
      for (int r = 0; r < world(); ++r) {
        EXPECT_TRUE(Changes(data, op, [r](std::vector<double>& v, std::vector<double>& f) {
          v.erase(v.begin() + r);
          f.erase(f.begin() + r);
        })) << data.what << " " << Name(op) << " world " << world() << ": dropping rank " << r;
      }
    }
  }
}

TEST_P(CollectiveDataTest, ADuplicatedRankChangesEveryReduction) {
  for (const Data& data : {ReduceScatterData(world()), AllReduceData(world())}) {
    for (ReduceOp op : SensitiveOps(data)) {
      for (int r = 0; r < world(); ++r) {
        for (int s = 0; s < world(); ++s) {
          if (s == r) continue;
          // Rank s's contribution (data and factor) also in rank r's place.
          ASSERT_TRUE(Changes(data, op, [r, s](std::vector<double>& v, std::vector<double>& f) {
            v[r] = v[s];
            f[r] = f[s];
          })) << data.what << " " << Name(op) << " world " << world() << ": rank " << s
              << " instead of rank " << r;
        }
      }
    }
  }
}

TEST_P(CollectiveDataTest, MisplacedContributionsChangeTheResult) {
  // reduce_scatter_tensor: every rank's output chunk differs from every other rank's.
  const Data scatter = ReduceScatterData(world());
  for (ReduceOp op : kOps) {
    std::set<std::vector<double>> chunks;
    for (int q = 0; q < world(); ++q) {
      std::vector<double> chunk;
      for (int64_t j = 0; j < kCount; ++j) chunk.push_back(scatter.Result(op, q * kCount + j));
      chunks.insert(chunk);
    }
    EXPECT_EQ(chunks.size(), static_cast<size_t>(world())) << Name(op) << " chunks";
  }
  // PREMUL_SUM: the data of two ranks with different factors swapped.
  for (const Data& data : {scatter, AllReduceData(world())}) {
    for (int r = 0; r < world(); ++r) {
      for (int s = r + 1; s < world(); ++s) {
        if (data.factors[r] == data.factors[s]) continue;
        EXPECT_TRUE(Changes(data, ReduceOp::kPremulSum,
                            [r, s](std::vector<double>& v, std::vector<double>&) {
                              std::swap(v[r], v[s]);
                            }))
            << data.what << " world " << world() << ": ranks " << r << " and " << s;
      }
    }
  }
  // PREMUL_SUM: any one rank's factor dropped (as an off-by-one loop, or a per-rank slice that
  // forgets to scale, would).
  for (const Data& data : {scatter, AllReduceData(world())}) {
    for (int r = 0; r < world(); ++r) {
      EXPECT_TRUE(Changes(data, ReduceOp::kPremulSum,
                          [r](std::vector<double>&, std::vector<double>& f) { f[r] = 1.0; }))
          << data.what << " world " << world() << ": rank " << r << "'s factor dropped";
    }
  }
  // Gathers: every rank's block differs from every other rank's.
  std::set<std::vector<double>> blocks;
  for (int r = 0; r < world(); ++r) blocks.insert(GatherValues(r, kCount));
  EXPECT_EQ(blocks.size(), static_cast<size_t>(world())) << "gathered blocks";
}

std::vector<int> Worlds() {
  std::vector<int> worlds;
  for (int w = 2; w <= 16; ++w) worlds.push_back(w);
  worlds.push_back(128);
  return worlds;
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectiveDataTest, testing::ValuesIn(Worlds()),
                         [](const testing::TestParamInfo<int>& info) {
                           return "W" + std::to_string(info.param);
                         });

TEST(CollectiveDataTest, InputsOfAWorldOfOneAreExactToo) {
  const ReduceLayout layout{1, kCount};
  for (int64_t i = 0; i < kCount; ++i) {
    for (ReduceOp op : kOps) {
      EXPECT_EQ(ExpectedReduction(op, layout, i),
                op == ReduceOp::kPremulSum ? PremulFactor(0, 1) * ReduceInput(layout, 0, i)
                                           : ReduceInput(layout, 0, i));
    }
  }
}

// Ranges are the element-by-element values, from any start (mid-chunk, inside or past the code
// digits, across chunk boundaries), and the expected reductions of a range are Reduce over the
// ranks' elements.
TEST(CollectiveDataTest, RangesAgreeWithSingleElementsFromAnyStart) {
  for (int world : {2, 3, 7, 128}) {
    for (int64_t chunk_size : {1, 2, 5, 7, 64}) {
      if (world == 128 && chunk_size > 7) continue;  // keeps the test fast
      const ReduceLayout layout{world, chunk_size};
      const int64_t numel = world * chunk_size + 3;
      for (int64_t begin : {int64_t{0}, int64_t{1}, chunk_size - 1, chunk_size + 2, numel - 2}) {
        const int64_t count = numel - begin;
        for (int r : {0, 1, world - 1}) {
          const std::vector<double> range = ReduceInputs(layout, r, begin, count);
          for (int64_t i = 0; i < count; ++i) {
            ASSERT_EQ(range[i], ReduceInput(layout, r, begin + i))
                << "world " << world << ", chunk " << chunk_size << ", rank " << r << ", from "
                << begin << ", element " << begin + i;
          }
        }
        for (ReduceOp op : kOps) {
          const std::vector<double> expected = ExpectedReductions(op, layout, begin, count);
          for (int64_t i = 0; i < count; ++i) {
            std::vector<double> values, factors;
            for (int r = 0; r < world; ++r) {
              values.push_back(ReduceInput(layout, r, begin + i));
              factors.push_back(PremulFactor(r, world));
            }
            ASSERT_EQ(expected[i], Reduce(op, values, factors, world))
                << Name(op) << " world " << world << ", element " << begin + i;
          }
        }
      }
    }
  }
}

TEST(CollectiveDataTest, ReductionIsRejectedOnlyForAvgAndPremulSumOnIntegers) {
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      const bool needs_float = op == ReduceOp::kAvg || op == ReduceOp::kPremulSum;
      EXPECT_EQ(ReductionIsRejected(op, dtype), needs_float && dtype == DType::kInt64)
          << Name(op) << " " << DTypeName(dtype);
    }
  }
}

}  // namespace
}  // namespace fsdp::conformance
