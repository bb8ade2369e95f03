// Scalar numerics shared by the CUDA kernels and their host unit tests: float16/bfloat16
// conversions that are bit-for-bit those of engine/core/dtype.cc (round to nearest even, the
// same NaN/overflow handling), the generic element conversion of ConvertElements
// (through double; half/bfloat16 through float), the Philox-4x32-10 block of
// engine/core/rng.cc, and the dropout keep/drop decision of kernels::DropoutMask.
// Compiled for host and device (FSDP_HOST_DEVICE), so the host tests check the device code.
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/ops/cuda/host_device.h"

namespace fsdp::ops::kernels::cuda {

FSDP_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
FSDP_HOST_DEVICE inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

FSDP_HOST_DEVICE inline uint16_t HalfBitsFromFloat(float value) {
  const uint32_t x = FloatBits(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    const float scaled = BitsFloat(abs) * 16777216.0f;  // exact
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(rintf(scaled)));  // nearest even
  }
  uint32_t mant_exp = abs - 0x38000000u;
  const uint32_t lsb = (mant_exp >> 13) & 1u;
  mant_exp += 0x0fffu + lsb;
  return static_cast<uint16_t>(sign | (mant_exp >> 13));
}

FSDP_HOST_DEVICE inline float FloatFromHalfBits(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    return BitsFloat(FloatBits(static_cast<float>(mant) * 5.9604644775390625e-08f) | sign);
  }
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

FSDP_HOST_DEVICE inline uint16_t BFloat16BitsFromFloat(float value) {
  uint32_t x = FloatBits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

FSDP_HOST_DEVICE inline float FloatFromBFloat16Bits(uint16_t bits) {
  return BitsFloat(static_cast<uint32_t>(bits) << 16);
}

// Element type codes, numerically equal to fsdp::DType (checked by a static_assert in the
// CUDA sources and by the host tests).
enum class ElemType : uint8_t { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3, kInt64 = 4 };

// Element `i` of `p` (of type `t`) as double: exact for every type (ConvertElements' LoadAsDouble).
FSDP_HOST_DEVICE inline double LoadDouble(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kFloat32: return static_cast<double>(static_cast<const float*>(p)[i]);
    case ElemType::kFloat64: return static_cast<const double*>(p)[i];
    case ElemType::kFloat16: return static_cast<double>(FloatFromHalfBits(static_cast<const uint16_t*>(p)[i]));
    case ElemType::kBFloat16: return static_cast<double>(FloatFromBFloat16Bits(static_cast<const uint16_t*>(p)[i]));
    case ElemType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0.0;
}

// Element `i` of `p` as float (exact for float16/bfloat16/float32).
FSDP_HOST_DEVICE inline float LoadFloat(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kFloat32: return static_cast<const float*>(p)[i];
    case ElemType::kFloat16: return FloatFromHalfBits(static_cast<const uint16_t*>(p)[i]);
    case ElemType::kBFloat16: return FloatFromBFloat16Bits(static_cast<const uint16_t*>(p)[i]);
    case ElemType::kFloat64: return static_cast<float>(static_cast<const double*>(p)[i]);
    case ElemType::kInt64: return static_cast<float>(static_cast<double>(static_cast<const int64_t*>(p)[i]));
  }
  return 0.0f;
}

// double -> int64 truncating toward zero; NaN, infinities and values outside int64's range
// give INT64_MIN, as x86's conversion (and so PyTorch on x86) does, instead of undefined
// behaviour. The same rule as core's ConvertElements (engine/core/dtype.cc).
FSDP_HOST_DEVICE inline int64_t TruncateToInt64(double v) {
  // 2^63 is exact in double; every double in (-2^63 - 1, 2^63) truncates into range.
  if (!(v > -9223372036854775809.0 && v < 9223372036854775808.0)) return INT64_MIN;
  return static_cast<int64_t>(v);
}

// Writes `v` (a float) as element `i` of `p`: float16/bfloat16 rounded once to nearest even.
FSDP_HOST_DEVICE inline void StoreFloat(void* p, ElemType t, int64_t i, float v) {
  switch (t) {
    case ElemType::kFloat32: static_cast<float*>(p)[i] = v; return;
    case ElemType::kFloat16: static_cast<uint16_t*>(p)[i] = HalfBitsFromFloat(v); return;
    case ElemType::kBFloat16: static_cast<uint16_t*>(p)[i] = BFloat16BitsFromFloat(v); return;
    case ElemType::kFloat64: static_cast<double*>(p)[i] = static_cast<double>(v); return;
    case ElemType::kInt64: static_cast<int64_t*>(p)[i] = TruncateToInt64(v); return;
  }
}

// Writes `v` (a double) like ConvertElements' StoreFromDouble: float16/bfloat16 through float,
// int64 truncating toward zero.
FSDP_HOST_DEVICE inline void StoreDouble(void* p, ElemType t, int64_t i, double v) {
  switch (t) {
    case ElemType::kFloat64: static_cast<double*>(p)[i] = v; return;
    case ElemType::kInt64: static_cast<int64_t*>(p)[i] = TruncateToInt64(v); return;
    default: StoreFloat(p, t, i, static_cast<float>(v)); return;
  }
}

// The Philox-4x32-10 block of Generator::Philox(key, counter_hi, counter_lo).
struct PhiloxBlock {
  uint32_t w[4];
};
FSDP_HOST_DEVICE inline PhiloxBlock Philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// DropoutMask's decision for element i: kept iff u < keep, u = (word >> 8) * 2^-24 of word
// (i mod 4) of Philox(seed, 0, offset + i / 4).
FSDP_HOST_DEVICE inline bool DropoutKeeps(uint32_t word, double keep) {
  const double u = static_cast<double>(word >> 8) * (1.0 / 16777216.0);
  return u < keep;
}

}  // namespace fsdp::ops::kernels::cuda
