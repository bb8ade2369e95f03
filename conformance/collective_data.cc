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

// Rank `rank`'s reduction input, element by element from `begin` on (see the file comment):
// the one definition of ReduceInput and ReduceInputs. Walks chunk and position forward instead
// of dividing per element, and advances the HIGH rank by one at every position past the code
// digits, so a range costs a few operations per element.
class ReduceInputWalk {
 public:
  ReduceInputWalk(const ReduceLayout& layout, int rank, int64_t begin)
      : layout_(layout),
        rank_(rank),
        magnitude_(AverageMagnitude(layout.world)),
        digits_(layout.world < 2 ? 0 : CodeDigits(layout.world)),
        chunk_(begin / layout.chunk_size),
        position_(begin % layout.chunk_size) {
    FSDP_CHECK(layout.world >= 1 && layout.chunk_size >= 1 && rank >= 0 && rank < layout.world &&
                   begin >= 0,
               "ReduceInput: rank ", rank, ", index ", begin, " outside a layout of world ",
               layout.world, " and chunk size ", layout.chunk_size);
    for (int k = 0; k < digits_; ++k) {
      code_digits_.push_back(BalancedTernaryDigit(RankCode(rank, layout.world), k));
    }
    // The number of high/low positions before the first one at or after `begin`.
    const int64_t past_digits = std::max<int64_t>(0, position_ - digits_);
    const int64_t turn = chunk_ * std::max<int64_t>(0, layout.chunk_size - digits_) + past_digits;
    high_ = static_cast<int>(turn % layout.world);
  }

  // The current element's value; then moves to the next element.
  double Next() {
    int deviation = 0;
    if (position_ < digits_) {
      deviation = code_digits_[static_cast<size_t>(position_)];
    } else if (digits_ > 0) {  // world >= 2
      const int low = high_ + 1 == layout_.world ? 0 : high_ + 1;
      deviation = rank_ == high_ ? 1 : rank_ == low ? -1 : 0;
      high_ = low;
    }
    const int sign = position_ < 63 && ((chunk_ >> position_) & 1) != 0 ? -1 : 1;
    if (++position_ == layout_.chunk_size) {
      position_ = 0;
      ++chunk_;
    }
    return sign * static_cast<double>(magnitude_ + deviation);
  }

 private:
  const ReduceLayout layout_;
  const int rank_;
  const int magnitude_;
  const int digits_;
  std::vector<int> code_digits_;  // d_r at the first digits_ positions of every chunk
  int64_t chunk_;
  int64_t position_;
  int high_ = 0;  // the HIGH rank of the next position past the digits
};

// Folds rank `r`'s contribution `v` (factor `factor`) into `acc`, in rank order from r = 0.
double Fold(distributed::ReduceOp op, double acc, double v, double factor, size_t r) {
  switch (op) {
    case distributed::ReduceOp::kSum:
    case distributed::ReduceOp::kAvg:
      return acc + v;
    case distributed::ReduceOp::kPremulSum:
      return acc + v * factor;
    case distributed::ReduceOp::kMin:
      return r == 0 ? v : std::min(acc, v);
    case distributed::ReduceOp::kMax:
      return r == 0 ? v : std::max(acc, v);
  }
  return acc;
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
  return ReduceInputWalk(layout, rank, index).Next();
}

std::vector<double> ReduceInputs(const ReduceLayout& layout, int rank, int64_t begin,
                                 int64_t count) {
  std::vector<double> v(static_cast<size_t>(count));
  ReduceInputWalk walk(layout, rank, begin);
  for (double& x : v) x = walk.Next();
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
    acc = Fold(op, acc, values[r], op == distributed::ReduceOp::kPremulSum ? factors[r] : 1.0, r);
  }
  return op == distributed::ReduceOp::kAvg ? acc / divisor : acc;
}

double ExpectedReduction(distributed::ReduceOp op, const ReduceLayout& layout, int64_t index) {
  return ExpectedReductions(op, layout, index, 1)[0];
}

std::vector<double> ExpectedReductions(distributed::ReduceOp op, const ReduceLayout& layout,
                                       int64_t begin, int64_t count) {
  // Reduce's fold, rank by rank over the whole range (the same operations in the same order
  // per element).
  std::vector<double> acc(static_cast<size_t>(count), 0.0);
  for (int r = 0; r < layout.world; ++r) {
    ReduceInputWalk walk(layout, r, begin);
    const double factor = PremulFactor(r, layout.world);
    for (double& a : acc) a = Fold(op, a, walk.Next(), factor, static_cast<size_t>(r));
  }
  if (op == distributed::ReduceOp::kAvg) {
    for (double& a : acc) a /= layout.world;
  }
  return acc;
}

}  // namespace fsdp::conformance
