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

uint16_t FloatToHalfBits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Scale so that the half subnormal LSB (2^-24) becomes 1, then round to nearest even.
    float f;
    std::memcpy(&f, &abs, 4);
    const float scaled = f * 16777216.0f;  // 2^24, exact
    const float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t mant_exp = abs - 0x38000000u;  // exponent rebias: (127-15) << 23
  const uint32_t lsb = (mant_exp >> 13) & 1u;
  mant_exp += 0x0fffu + lsb;
  return static_cast<uint16_t>(sign | (mant_exp >> 13));
}

float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = static_cast<float>(mant) * 5.9604644775390625e-08f;
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t FloatToBFloat16Bits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

float BFloat16BitsToFloat(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &x, 4);
  return out;
}

Half::Half(float value) : bits(FloatToHalfBits(value)) {}
Half::operator float() const { return HalfBitsToFloat(bits); }
BFloat16::BFloat16(float value) : bits(FloatToBFloat16Bits(value)) {}
BFloat16::operator float() const { return BFloat16BitsToFloat(bits); }

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
