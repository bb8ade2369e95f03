#include "engine/core/dtype.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace fsdp {
namespace {

TEST(CoreDType, HalfRoundTripsEveryFiniteBitPattern) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = HalfBitsToFloat(bits);
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalfBits(f), bits) << "bits=" << b;
  }
}

TEST(CoreDType, HalfRoundsToNearestEven) {
  // 1 + 2^-11 lies exactly between 1 and the next half (1 + 2^-10): ties to even -> 1.
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 lies between 1+2^-10 (odd mantissa) and 1+2^-9: ties to even -> 1+2^-9.
  EXPECT_EQ(FloatToHalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(FloatToHalfBits(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(CoreDType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  // 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(BFloat16BitsToFloat(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(FloatToBFloat16Bits(std::nanf("")))));
}

// Conversions to int64 that C++ leaves undefined (NaN, infinities, out of range) give INT64_MIN,
// as x86 and PyTorch on x86 do; everything else truncates toward zero.
TEST(CoreDType, NonFiniteAndOutOfRangeToInt64GiveInt64Min) {
  const double in[6] = {std::nan(""), INFINITY, -INFINITY, 1e300, -1e19, -7.9};
  int64_t out[6];
  ConvertElements(in, DType::kFloat64, out, DType::kInt64, 6);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], INT64_MIN) << in[i];
  EXPECT_EQ(out[5], -7);
}

TEST(CoreDType, ConvertElementsBetweenAllTypes) {
  const double in[4] = {1.5, -2.0, 3.25, 0.0};
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    std::vector<char> buf(4 * ElementSize(d));
    ConvertElements(in, DType::kFloat64, buf.data(), d, 4);
    double out[4];
    ConvertElements(buf.data(), d, out, DType::kFloat64, 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], in[i]) << DTypeName(d);
  }
  int64_t ints[4];
  ConvertElements(in, DType::kFloat64, ints, DType::kInt64, 4);
  EXPECT_EQ(ints[0], 1);
  EXPECT_EQ(ints[1], -2);
}

TEST(CoreDType, ParsesNamesAndRejectsUnknown) {
  EXPECT_EQ(ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(ParseDType("float16"), DType::kFloat16);
  EXPECT_THROW(ParseDType("float8"), Error);
}

TEST(CoreDType, FinfoEpsIsTheGapAfterOne) {
  EXPECT_EQ(FinfoEps(DType::kFloat32), std::numeric_limits<float>::epsilon());
  EXPECT_EQ(FinfoEps(DType::kFloat64), std::numeric_limits<double>::epsilon());
  // 1 + eps is the next representable value; 1 + eps / 2 rounds (to even) back to 1.
  const auto half_eps = static_cast<float>(FinfoEps(DType::kFloat16));
  EXPECT_EQ(static_cast<float>(Half(1.0F + half_eps)), 1.0F + half_eps);
  EXPECT_EQ(static_cast<float>(Half(1.0F + half_eps / 2)), 1.0F);
  const auto bf16_eps = static_cast<float>(FinfoEps(DType::kBFloat16));
  EXPECT_EQ(static_cast<float>(BFloat16(1.0F + bf16_eps)), 1.0F + bf16_eps);
  EXPECT_EQ(static_cast<float>(BFloat16(1.0F + bf16_eps / 2)), 1.0F);
  EXPECT_THROW(FinfoEps(DType::kInt64), Error);
}

}  // namespace
}  // namespace fsdp
