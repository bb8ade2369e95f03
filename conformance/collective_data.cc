#include "conformance/collective_data.h"

#include <algorithm>

#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

// a: the magnitude of every element's average; a * world <= 128.
int AverageMagnitude(int world) { return world <= 64 ? 2 : 1; }

// Digit `digit` (0: the lowest) of `value` in balanced ternary (digits -1, 0, 1).
int BalancedTernaryDigit(int64_t value, int digit) {
  for (int k = 0; k < digit; ++k) {
    const int64_t d = ((value % 3) + 4) % 3 - 1;  // value - d is divisible by 3
    value = (value - d) / 3;
  }
  return static_cast<int>(((value % 3) + 4) % 3 - 1);
}

// Rank `rank`'s code: ranks 2k and 2k + 1 get +(k + 1) and -(k + 1); the last rank of an odd
// world gets 0. Distinct per rank, summing to 0 over the world.
int64_t RankCode(int rank, int world) {
  if (rank >= world - world % 2) return 0;
  const int64_t k = rank / 2 + 1;
  return rank % 2 == 0 ? k : -k;
}

// D: balanced-ternary digits enough for every code, |code| <= world / 2 ((3^D - 1) / 2 is the
// largest D digits hold).
int CodeDigits(int world) {
  int digits = 0;
  int64_t largest = 0;
  while (largest < world / 2) {
    largest = 3 * largest + 1;
    ++digits;
  }
  return digits;
}

// d_r of element `index` (see the file comment).
int Deviation(const ReduceLayout& layout, int rank, int64_t index) {
  if (layout.world < 2) return 0;
  const int64_t chunk = index / layout.chunk_size;
  const int64_t position = index % layout.chunk_size;
  const int digits = CodeDigits(layout.world);
  if (position < digits) {
    return BalancedTernaryDigit(RankCode(rank, layout.world), static_cast<int>(position));
  }
  // The number of high/low positions before this one, over all chunks.
  const int64_t turn = chunk * (layout.chunk_size - digits) + (position - digits);
  const int high = static_cast<int>(turn % layout.world);
  const int low = (high + 1) % layout.world;
  return rank == high ? 1 : rank == low ? -1 : 0;
}

// s of element `index`: -1 when bit `position` of the chunk index is set.
int Sign(const ReduceLayout& layout, int64_t index) {
  const int64_t chunk = index / layout.chunk_size;
  const int64_t position = index % layout.chunk_size;
  return position < 63 && ((chunk >> position) & 1) != 0 ? -1 : 1;
}

}  // namespace

double GatherValue(int rank, int64_t index) {
  return static_cast<double>((7 * static_cast<int64_t>(rank) + 3 * index) % 251 - 125);
}

std::vector<double> GatherValues(int rank, int64_t count) {
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = GatherValue(rank, i);
  return v;
}

double ReduceInput(const ReduceLayout& layout, int rank, int64_t index) {
  FSDP_CHECK(layout.world >= 1 && layout.chunk_size >= 1 && rank >= 0 && rank < layout.world &&
                 index >= 0,
             "ReduceInput: rank ", rank, ", index ", index, " outside a layout of world ",
             layout.world, " and chunk size ", layout.chunk_size);
  return Sign(layout, index) *
         static_cast<double>(AverageMagnitude(layout.world) + Deviation(layout, rank, index));
}

std::vector<double> ReduceInputs(const ReduceLayout& layout, int rank, int64_t begin,
                                 int64_t count) {
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = ReduceInput(layout, rank, begin + i);
  return v;
}

bool ReductionIsRejected(distributed::ReduceOp op, DType dtype) {
  return (op == distributed::ReduceOp::kAvg || op == distributed::ReduceOp::kPremulSum) &&
         !IsFloatingPoint(dtype);
}

double PremulFactor(int rank, int /*world*/) { return rank % 2 == 0 ? 2.0 : 4.0; }

double Reduce(distributed::ReduceOp op, const std::vector<double>& values,
              const std::vector<double>& factors, int divisor) {
  FSDP_CHECK(!values.empty(), "Reduce: no contributions");
  FSDP_CHECK(op != distributed::ReduceOp::kPremulSum || factors.size() == values.size(),
             "Reduce: PREMUL_SUM needs one factor per contribution, got ", factors.size(),
             " for ", values.size());
  double acc = 0;
  for (size_t r = 0; r < values.size(); ++r) {
    const double v = values[r];
    switch (op) {
      case distributed::ReduceOp::kSum:
      case distributed::ReduceOp::kAvg:
        acc += v;
        break;
      case distributed::ReduceOp::kPremulSum:
        acc += v * factors[r];
        break;
      case distributed::ReduceOp::kMin:
        acc = r == 0 ? v : std::min(acc, v);
        break;
      case distributed::ReduceOp::kMax:
        acc = r == 0 ? v : std::max(acc, v);
        break;
    }
  }
  return op == distributed::ReduceOp::kAvg ? acc / divisor : acc;
}

double ExpectedReduction(distributed::ReduceOp op, const ReduceLayout& layout, int64_t index) {
  std::vector<double> values(static_cast<size_t>(layout.world));
  std::vector<double> factors(static_cast<size_t>(layout.world));
  for (int r = 0; r < layout.world; ++r) {
    values[r] = ReduceInput(layout, r, index);
    factors[r] = PremulFactor(r, layout.world);
  }
  return Reduce(op, values, factors, layout.world);
}

std::vector<double> ExpectedReductions(distributed::ReduceOp op, const ReduceLayout& layout,
                                       int64_t begin, int64_t count) {
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = ExpectedReduction(op, layout, begin + i);
  return v;
}

}  // namespace fsdp::conformance
