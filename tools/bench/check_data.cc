#include "tools/bench/check_data.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/core/error.h"

namespace fsdp::bench {

namespace {

// Significand bits (including the implicit one) of the floating dtypes.
int SignificandBits(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 24;
    case DType::kFloat64:
      return 53;
    case DType::kFloat16:
      return 11;
    case DType::kBFloat16:
      return 8;
    case DType::kInt64:
      return 62;
  }
  return 8;
}

// The expected reduced value of any element j with j mod P == k, for k in [0, P).
std::vector<double> ReducedTable(distributed::ReduceOp redop, int world_size, int64_t m) {
  const int64_t p = 2 * m + 1;
  std::vector<double> table(static_cast<size_t>(p));
  for (int64_t k = 0; k < p; ++k) {
    double acc = 0;
    for (int r = 0; r < world_size; ++r) {
      const auto v = static_cast<double>(CheckValue(r, k, m));
      if (r == 0) {
        acc = v;
      } else if (redop == distributed::ReduceOp::kMin) {
        acc = std::min(acc, v);
      } else if (redop == distributed::ReduceOp::kMax) {
        acc = std::max(acc, v);
      } else {
        acc += v;
      }
    }
    if (redop == distributed::ReduceOp::kAvg) acc /= world_size;
    table[static_cast<size_t>(k)] = acc;
  }
  return table;
}

template <typename T>
double AsDouble(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

// Counts the elements i of `output` whose value is not expected(first + i): exactly, or
// within `rel_tolerance` * |expected| when it is positive.
template <typename Expected>
int64_t CountWrong(const Tensor& output, int64_t first, double rel_tolerance,
                   const Expected& expected) {
  const int64_t n = output.numel();
  int64_t wrong = 0;
  DispatchDType(output.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(output.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const double want = expected(first + i);
      const double got = AsDouble(data[i]);
      const bool ok = rel_tolerance == 0 ? got == want
                                         : std::abs(got - want) <= rel_tolerance * std::abs(want);
      if (!ok) ++wrong;
    }
  });
  return wrong;
}

}  // namespace

int64_t CheckValueBound(DType dtype, int world_size) {
  FSDP_CHECK(world_size >= 1, "check data: world size must be >= 1, got ", world_size);
  const int64_t exact = int64_t{1} << SignificandBits(dtype);
  return std::min<int64_t>(8, exact / world_size);
}

int64_t CheckValue(int rank, int64_t index, int64_t m) {
  const int64_t p = 2 * m + 1;
  return (index + rank) % p - m;
}

void FillCheckValues(const Tensor& input, int rank, int64_t first, int world_size) {
  const int64_t m = CheckValueBound(input.dtype(), world_size);
  const int64_t n = input.numel();
  DispatchDType(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* data = static_cast<T*>(input.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const auto v = CheckValue(rank, first + i, m);
      if constexpr (std::is_same_v<T, int64_t>) {
        data[i] = v;
      } else {
        data[i] = T(static_cast<float>(v));
      }
    }
  });
}

int64_t CountWrongCopies(const Tensor& output, int64_t first, int world_size,
                         const std::function<int(int64_t j)>& source_rank) {
  const int64_t m = CheckValueBound(output.dtype(), world_size);
  return CountWrong(output, first, 0.0, [&](int64_t j) {
    return static_cast<double>(CheckValue(source_rank(j), j, m));
  });
}

int64_t CountWrongReduction(const Tensor& output, int64_t first, distributed::ReduceOp redop,
                            int world_size) {
  const DType dtype = output.dtype();
  const int64_t m = CheckValueBound(dtype, world_size);
  const int64_t p = 2 * m + 1;
  const std::vector<double> table = ReducedTable(redop, world_size, m);
  const double tolerance = redop == distributed::ReduceOp::kAvg
                               ? std::ldexp(1.0, 1 - SignificandBits(dtype))
                               : 0.0;
  return CountWrong(output, first, tolerance,
                    [&](int64_t j) { return table[static_cast<size_t>(j % p)]; });
}

}  // namespace fsdp::bench
