// Element types: f32, f64, f16, bf16, i64. Half and BFloat16 are 16-bit storage types whose
// conversions from float round to nearest, ties to even (like c10::Half / c10::BFloat16).
// Thread-safety: value types, stateless functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace fsdp {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt64 };

// PyTorch's spelling: "float32", "float64", "float16", "bfloat16", "int64".
const char* DTypeName(DType dtype);
// Parses PyTorch spellings and the short aliases f32, f64, f16, bf16, i64, fp32, fp16.
DType ParseDType(const std::string& name);
size_t ElementSize(DType dtype);
bool IsFloatingPoint(DType dtype);
// torch.finfo(dtype).eps: the gap between 1 and the next representable value (2^-23, 2^-52,
// 2^-10, 2^-7). Throws InvalidArgument for a non-floating dtype.
double FinfoEps(DType dtype);

// IEEE 754 binary16.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float value);  // NOLINT(google-explicit-constructor): mirrors c10::Half
  operator float() const;  // NOLINT(google-explicit-constructor)
  static Half FromBits(uint16_t b) { Half h; h.bits = b; return h; }
};

// bfloat16: the upper 16 bits of an f32, rounded to nearest even; NaN stays NaN.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float value);  // NOLINT(google-explicit-constructor)
  operator float() const;  // NOLINT(google-explicit-constructor)
  static BFloat16 FromBits(uint16_t b) { BFloat16 h; h.bits = b; return h; }
};

// The conversions, inline: the kernels and collectives call them per element.
inline uint16_t FloatToHalfBits(float value) {
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
    const float scaled = f * 16777216.0f;    // 2^24, exact
    const float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t mant_exp = abs - 0x38000000u;  // exponent rebias: (127-15) << 23
  const uint32_t lsb = (mant_exp >> 13) & 1u;
  mant_exp += 0x0fffu + lsb;
  return static_cast<uint16_t>(sign | (mant_exp >> 13));
}

inline float HalfBitsToFloat(uint16_t h) {
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

inline uint16_t FloatToBFloat16Bits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

inline float BFloat16BitsToFloat(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &x, 4);
  return out;
}

inline Half::Half(float value) : bits(FloatToHalfBits(value)) {}
inline Half::operator float() const { return HalfBitsToFloat(bits); }
inline BFloat16::BFloat16(float value) : bits(FloatToBFloat16Bits(value)) {}
inline BFloat16::operator float() const { return BFloat16BitsToFloat(bits); }

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };

// [Note: opmath type] The one accumulation-type rule of the engine: arithmetic on elements of
// storage type T runs in OpMath<T> (ATen's at::opmath_type; for floating types also
// at::acc_type's CUDA rule): float for Half and BFloat16, T itself otherwise (float stays
// float, double stays double, int64_t stays int64_t; unlike at::acc_type's CPU rule, float is
// not widened to double). Used by the autograd gradient sums (engine/autograd/grad_kernels.cc),
// the optimizer element loops (engine/optim/update_kernels.h) and, as OpMathDType, by the ops
// kernels' compute copies (engine/ops/kernel_util.h ComputeDType).
template <typename T> struct OpMathType { using type = T; };
template <> struct OpMathType<Half> { using type = float; };
template <> struct OpMathType<BFloat16> { using type = float; };
template <typename T> using OpMath = typename OpMathType<T>::type;
// The dtype of OpMath<T> for the storage type T of `dtype`: float32 for float16/bfloat16,
// otherwise `dtype` itself.
inline DType OpMathDType(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 ? DType::kFloat32 : dtype;
}

// Calls fn(T{}) with the C++ type of `dtype` (float, double, Half, BFloat16, int64_t).
template <typename Fn>
decltype(auto) DispatchDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kFloat16: return fn(Half{});
    case DType::kBFloat16: return fn(BFloat16{});
    case DType::kInt64: return fn(int64_t{});
  }
  return fn(float{});
}

// Converts `n` elements from `src` (dtype `src_dtype`) to `dst` (dtype `dst_dtype`).
// Float→integer conversion truncates toward zero like a C++ cast; the buffers may not overlap
// unless the dtypes are equal and the pointers are identical.
void ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

}  // namespace fsdp
