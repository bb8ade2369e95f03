#include "engine/distributed/reduce_op.h"

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

// [Note: vectorised rank-order reduction] The elements are reduced in blocks of kBlock in an
// accumulator that stays in L1: the block is loaded from rank 0, then every other rank's block
// is combined into it, then it is rounded into the output. Element i only ever meets element i
// (rank 0, then 1, ...), so the per-element order of operations is exactly the scalar
// definition's and results are bit-identical to it (reduce_op_test.cc checks them against a
// plain element-by-element loop). Full blocks run with the compile-time trip count kBlock,
// which lets the compiler vectorise every loop at -O2 (GCC's "very cheap" cost model refuses
// loops whose count is unknown); the last, partial block runs the same code with a runtime
// count. No FMA contraction can change a PREMUL_SUM: the build targets baseline x86-64.
template <typename T>
void ReduceTyped(ReduceOp op, const std::vector<const void*>& inputs,
                 const std::vector<double>& factors, void* output, size_t numel) {
  using A = OpMath<T>;  // float for f32/f16/bf16, double for f64, int64 for i64
  constexpr size_t kBlock = 1024;
  alignas(64) A acc[kBlock];
  const size_t ranks = inputs.size();
  T* out = static_cast<T*>(output);
  std::vector<A> scale(ranks, A(1));
  if (op == ReduceOp::kPremulSum) {
    for (size_t r = 0; r < ranks; ++r) scale[r] = static_cast<A>(factors[r]);
  }
  // Reduces elements [begin, begin + n) of every input into out; `n` is either kBlock as a
  // std::integral_constant (a compile-time trip count) or a runtime size_t.
  auto reduce_block = [&](size_t begin, auto n) {
    const T* first = static_cast<const T*>(inputs[0]) + begin;
    if (op == ReduceOp::kPremulSum) {
      const A s = scale[0];
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<A>(first[i]) * s;
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
        case ReduceOp::kPremulSum: {
          const A s = scale[r];
          for (size_t i = 0; i < n; ++i) acc[i] += static_cast<A>(in[i]) * s;
          break;
        }
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
    T* dst = out + begin;
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(acc[i]);
  };
  const size_t full = numel - numel % kBlock;
  for (size_t begin = 0; begin < full; begin += kBlock) {
    reduce_block(begin, std::integral_constant<size_t, kBlock>{});
  }
  if (full < numel) reduce_block(full, numel - full);
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
