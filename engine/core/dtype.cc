#include "engine/core/dtype.h"

#include <cmath>
#include <cstdint>

#include "engine/core/error.h"

namespace fsdp {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt64: return "int64";
  }
  return "unknown";
}

DType ParseDType(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "fp32" || name == "float") return DType::kFloat32;
  if (name == "float64" || name == "f64" || name == "fp64" || name == "double") return DType::kFloat64;
  if (name == "float16" || name == "f16" || name == "fp16" || name == "half") return DType::kFloat16;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "int64" || name == "i64" || name == "long") return DType::kInt64;
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown dtype '", name,
             "'; valid: float32, float64, float16, bfloat16, int64");
}

size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt64: return 8;
  }
  return 0;
}

bool IsFloatingPoint(DType dtype) { return dtype != DType::kInt64; }

double FinfoEps(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return std::ldexp(1.0, -23);
    case DType::kFloat64: return std::ldexp(1.0, -52);
    case DType::kFloat16: return std::ldexp(1.0, -10);
    case DType::kBFloat16: return std::ldexp(1.0, -7);
    case DType::kInt64: break;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "finfo: dtype ", DTypeName(dtype),
             " is not a floating point type");
}

namespace {
template <typename T>
double LoadAsDouble(const T& v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}
template <typename T>
T StoreFromDouble(double v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    // double -> float -> half matches PyTorch's double->half path for the values we produce;
    // f32 inputs (the common case) convert exactly to double first, so no double rounding.
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // Truncation toward zero; NaN, infinities and values outside int64's range give INT64_MIN,
    // as x86's conversion (and PyTorch on x86) does, instead of undefined behaviour. The same
    // rule as the kernels' TruncateToInt64 (engine/ops/cuda/numerics.h).
    if (!(v > -9223372036854775809.0 && v < 9223372036854775808.0)) return INT64_MIN;
    return static_cast<int64_t>(v);
  } else {
    return static_cast<T>(v);
  }
}
}  // namespace

void ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (n == 0) return;
  if (src_dtype == dst_dtype) {
    if (src != dst) std::memmove(dst, src, n * ElementSize(src_dtype));
    return;
  }
  DispatchDType(src_dtype, [&](auto s) {
    using S = decltype(s);
    const S* in = static_cast<const S*>(src);
    DispatchDType(dst_dtype, [&](auto d) {
      using D = decltype(d);
      D* out = static_cast<D*>(dst);
      if constexpr (std::is_same_v<S, float> && (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)) {
        for (size_t i = 0; i < n; ++i) out[i] = D(in[i]);
      } else {
        for (size_t i = 0; i < n; ++i) out[i] = StoreFromDouble<D>(LoadAsDouble(in[i]));
      }
    });
  });
}

}  // namespace fsdp
