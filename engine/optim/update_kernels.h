// Element loops shared by the optimizers (internal to engine/optim).
//
// Each optimizer update is written as PyTorch's sequence of single-tensor ops; every op's
// result is rounded to the storage type T, computing in Acc<T> (double for float64, float
// otherwise), as ATen's CPU kernels do with opmath types.
// Thread-safety: stateless.
#pragma once

#include <cmath>
#include <type_traits>

#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace fsdp::optim::internal {

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Rounds an Acc<T> value to T and back (the result of one ATen op stored in a T tensor).
template <typename T>
inline Acc<T> Round(Acc<T> x) {
  return static_cast<Acc<T>>(static_cast<T>(x));
}

template <typename T>
inline Acc<T> Load(const T* p, int64_t i) {
  return static_cast<Acc<T>>(p[i]);
}

template <typename T>
inline void Store(T* p, int64_t i, Acc<T> x) {
  p[i] = static_cast<T>(x);
}

// at::native lerp (scalar form): self + w * (end - self) for |w| < 0.5, else
// end - (end - self) * (1 - w).
template <typename A>
inline A Lerp(A self, A end, A weight) {
  return std::abs(weight) < A(0.5) ? self + weight * (end - self)
                                   : end - (end - self) * (A(1) - weight);
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
