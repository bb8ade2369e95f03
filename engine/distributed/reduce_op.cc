#include "engine/distributed/reduce_op.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "engine/core/error.h"

namespace fsdp::distributed {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kAvg:
      return "AVG";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kPremulSum:
      return "PREMUL_SUM";
  }
  return "UNKNOWN";
}

bool ReduceOpSupports(ReduceOp op, DType dtype) {
  if (op == ReduceOp::kAvg || op == ReduceOp::kPremulSum) return IsFloatingPoint(dtype);
  return true;
}

namespace {

template <typename A>
A MinOf(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a) return a;  // NaN propagates, as torch.minimum does
    if (b != b) return b;
  }
  return b < a ? b : a;
}

template <typename A>
A MaxOf(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b > a ? b : a;
}

template <typename T>
void ReduceTyped(ReduceOp op, const std::vector<const void*>& inputs,
                 const std::vector<double>& factors, void* output, size_t numel) {
  using A = OpMath<T>;  // float for f32/f16/bf16, double for f64, int64 for i64
  constexpr size_t kBlock = 1024;
  std::array<A, kBlock> acc;
  const size_t ranks = inputs.size();
  T* out = static_cast<T*>(output);
  std::vector<A> scale(ranks, A(1));
  if (op == ReduceOp::kPremulSum) {
    for (size_t r = 0; r < ranks; ++r) scale[r] = static_cast<A>(factors[r]);
  }
  for (size_t begin = 0; begin < numel; begin += kBlock) {
    const size_t n = std::min(kBlock, numel - begin);
    const T* first = static_cast<const T*>(inputs[0]) + begin;
    if (op == ReduceOp::kPremulSum) {
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<A>(first[i]) * scale[0];
    } else {
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<A>(first[i]);
    }
    for (size_t r = 1; r < ranks; ++r) {
      const T* in = static_cast<const T*>(inputs[r]) + begin;
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          for (size_t i = 0; i < n; ++i) acc[i] += static_cast<A>(in[i]);
          break;
        case ReduceOp::kPremulSum:
          for (size_t i = 0; i < n; ++i) acc[i] += static_cast<A>(in[i]) * scale[r];
          break;
        case ReduceOp::kMin:
          for (size_t i = 0; i < n; ++i) acc[i] = MinOf(acc[i], static_cast<A>(in[i]));
          break;
        case ReduceOp::kMax:
          for (size_t i = 0; i < n; ++i) acc[i] = MaxOf(acc[i], static_cast<A>(in[i]));
          break;
      }
    }
    if (op == ReduceOp::kAvg) {
      const A divisor = static_cast<A>(ranks);
      for (size_t i = 0; i < n; ++i) acc[i] /= divisor;
    }
    for (size_t i = 0; i < n; ++i) out[begin + i] = static_cast<T>(acc[i]);
  }
}

}  // namespace

void ReduceInRankOrder(DType dtype, ReduceOp op, const std::vector<const void*>& inputs,
                       const std::vector<double>& premul_factors, void* output, size_t numel) {
  FSDP_CHECK(ReduceOpSupports(op, dtype), "ReduceOp ", ReduceOpName(op),
             " needs a floating-point dtype, got ", DTypeName(dtype));
  FSDP_CHECK(!inputs.empty(), "ReduceInRankOrder: no inputs");
  FSDP_CHECK(op != ReduceOp::kPremulSum || premul_factors.size() == inputs.size(),
             "ReduceInRankOrder: PREMUL_SUM needs one factor per input, got ",
             premul_factors.size(), " factors for ", inputs.size(), " inputs");
  if (numel == 0) return;
  DispatchDType(dtype, [&](auto tag) {
    using T = decltype(tag);
    ReduceTyped<T>(op, inputs, premul_factors, output, numel);
  });
}

}  // namespace fsdp::distributed
