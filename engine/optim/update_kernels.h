// CPU side of the optimizer element loops (internal to engine/optim): the storage rounding of
// a storage type T (update_math.h), typed element access in T's accumulation type OpMath<T>
// (engine/core/dtype.h, [Note: opmath type]: float for float32/float16/bfloat16, double for
// float64), and the dispatch from a parameter's dtype to its C++ storage type. The update
// formulas themselves live in update_math.h, shared with the CUDA kernels.
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "engine/optim/update_math.h"

namespace fsdp::optim::internal {

// The update_math.h rounding policy of storage type T.
template <typename T>
auto RoundingFor() {
  if constexpr (std::is_same_v<T, Half>) {
    return math::Float16Rounding{};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return math::BFloat16Rounding{};
  } else {
    return math::ExactRounding<OpMath<T>>{};
  }
}

template <typename T>
inline OpMath<T> Load(const T* p, int64_t i) {
  return static_cast<OpMath<T>>(p[i]);
}

template <typename T>
inline void Store(T* p, int64_t i, OpMath<T> x) {
  p[i] = static_cast<T>(x);
}

// Calls fn(T{}) for the floating-point storage type of `dtype`.
template <typename Fn>
void DispatchFloating(DType dtype, const char* who, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      fn(float{});
      return;
    case DType::kFloat64:
      fn(double{});
      return;
    case DType::kFloat16:
      fn(Half{});
      return;
    case DType::kBFloat16:
      fn(BFloat16{});
      return;
    case DType::kInt64:
      break;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, who, ": parameters must be floating point, got ",
             DTypeName(dtype));
}

}  // namespace fsdp::optim::internal
