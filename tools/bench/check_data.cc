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
std::vector<double> ReducedTable(dist::ReduceOp redop, int world_size, int64_t m) {
  const int64_t p = 2 * m + 1;
  std::vector<double> table(static_cast<size_t>(p));
  for (int64_t k = 0; k < p; ++k) {
    double acc = 0;
    for (int r = 0; r < world_size; ++r) {
      const auto v = static_cast<double>(CheckValue(r, k, m));
      if (r == 0) {
        acc = v;
      } else if (redop == dist::ReduceOp::kMin) {
        acc = std::min(acc, v);
      } else if (redop == dist::ReduceOp::kMax) {
        acc = std::max(acc, v);
      } else {
        acc += v;
      }
    }
    if (redop == dist::ReduceOp::kAvg) acc /= world_size;
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

void FillCheckInput(BenchCollective op, const Tensor& input, const CollectiveCounts& counts,
                    int rank, int world_size) {
  FSDP_CHECK(input.numel() == counts.input_numel, "check data: ", BenchCollectiveName(op),
             " input has ", input.numel(), " elements, expected ", counts.input_numel);
  const int64_t m = CheckValueBound(input.dtype(), world_size);
  const int64_t first = op == BenchCollective::kAllGather ? rank * counts.per_rank_numel : 0;
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

int64_t CountWrongElements(BenchCollective op, dist::ReduceOp redop, const Tensor& output,
                           const CollectiveCounts& counts, int rank, int world_size) {
  FSDP_CHECK(output.numel() == counts.output_numel, "check data: ", BenchCollectiveName(op),
             " output has ", output.numel(), " elements, expected ", counts.output_numel);
  const DType dtype = output.dtype();
  const int64_t m = CheckValueBound(dtype, world_size);
  const int64_t p = 2 * m + 1;
  const int64_t n = output.numel();
  std::vector<double> table;
  int64_t first = 0;  // full-array index of output element 0
  if (IsReduction(op)) {
    table = ReducedTable(redop, world_size, m);
    if (op == BenchCollective::kReduceScatter) first = rank * counts.per_rank_numel;
  }
  const double tolerance = redop == dist::ReduceOp::kAvg && IsReduction(op)
                               ? std::ldexp(1.0, 1 - SignificandBits(dtype))
                               : 0.0;
  int64_t wrong = 0;
  DispatchDType(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(output.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = first + i;
      double expected = 0;
      switch (op) {
        case BenchCollective::kAllGather:
          expected =
              static_cast<double>(CheckValue(static_cast<int>(j / counts.per_rank_numel), j, m));
          break;
        case BenchCollective::kBroadcast:
          expected = static_cast<double>(CheckValue(0, j, m));
          break;
        case BenchCollective::kReduceScatter:
        case BenchCollective::kAllReduce:
          expected = table[static_cast<size_t>(j % p)];
          break;
      }
      const double got = AsDouble(data[i]);
      const bool ok = tolerance == 0 ? got == expected
                                     : std::abs(got - expected) <= tolerance * std::abs(expected);
      if (!ok) ++wrong;
    }
  });
  return wrong;
}

}  // namespace fsdp::bench
