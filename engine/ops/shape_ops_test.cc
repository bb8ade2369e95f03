#include "engine/ops/shape_ops.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops/compare.h"
#include "engine/testing/ops_test_util.h"

namespace fsdp::ops::kernels {
namespace {

using testing::ExpectValues;
using testing::Randn;

constexpr DType kF64 = DType::kFloat64;

TEST(KernelShape, TransposeAndPermute) {
  const Tensor x = Tensor::from_doubles({0, 1, 2, 3, 4, 5}, {2, 3});
  const Tensor t = Transpose(x, 0, 1);
  EXPECT_EQ(t.sizes(), (Shape{3, 2}));
  ExpectValues(t, {0, 3, 1, 4, 2, 5}, 0, "transpose");
  const Tensor y = Randn({2, 3, 4, 5}, 1);
  const std::vector<int64_t> dims = {2, 0, 3, 1};
  const Tensor p = Permute(y, dims);
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 5, 3}));
  // p[a, b, c, d] = y[b, d, a, c]
  EXPECT_EQ(p.to_doubles()[((1 * 2 + 1) * 5 + 3) * 3 + 2], y.to_doubles()[((1 * 3 + 2) * 4 + 1) * 5 + 3]);
  EXPECT_EQ(MaxAbsDiff(Permute(p, InversePermutation(dims)), y), 0.0);
  EXPECT_EQ(MaxAbsDiff(Transpose(Transpose(y, 1, -1), 1, -1), y), 0.0);
  EXPECT_THROW(Permute(y, {0, 0, 1, 2}), Error);
  EXPECT_THROW(Transpose(y, 0, 4), Error);
  // Works on int64 and 16-bit dtypes (byte moves).
  EXPECT_EQ(Transpose(Tensor::from_int64s({1, 2, 3, 4}, {2, 2}), 0, 1).to_int64s(), (std::vector<int64_t>{1, 3, 2, 4}));
  ExpectValues(Transpose(x.to(DType::kBFloat16), 0, 1), {0, 3, 1, 4, 2, 5}, 0, "bf16 transpose");
}

TEST(KernelShape, CatNarrowAndBackward) {
  const Tensor a = Tensor::from_doubles({1, 2, 3, 4}, {2, 2});
  const Tensor b = Tensor::from_doubles({5, 6}, {2, 1}, kF64);
  const Tensor c = Cat({a, b}, 1);
  EXPECT_EQ(c.dtype(), kF64);
  ExpectValues(c, {1, 2, 5, 3, 4, 6}, 0, "cat dim 1");
  ExpectValues(Cat({a, a}, 0), {1, 2, 3, 4, 1, 2, 3, 4}, 0, "cat dim 0");
  ExpectValues(Cat({Tensor::zeros({0}), a}, -1), {1, 2, 3, 4}, 0, "legacy empty skipped");
  EXPECT_THROW(Cat({a, Tensor::zeros({3, 1})}, 1), Error);
  ExpectValues(Narrow(c, 1, 1, 2), {2, 5, 4, 6}, 0, "narrow");
  ExpectValues(Narrow(c, -1, -1, 1), {5, 6}, 0, "narrow negative");
  ExpectValues(NarrowBackward(Tensor::from_doubles({7, 8}, {2, 1}), {2, 3}, 1, 1), {0, 7, 0, 0, 8, 0}, 0,
               "narrow backward");
  EXPECT_THROW(Narrow(c, 1, 2, 2), Error);
}

TEST(KernelShape, CastRoundsToNearestEven) {
  const Tensor third = Tensor::from_doubles({1.0 / 3}, {1}, kF64);
  EXPECT_EQ(Cast(third, DType::kBFloat16).item(), 0.333984375);
  EXPECT_EQ(Cast(third, DType::kFloat16).item(), 0.333251953125);
  EXPECT_EQ(Cast(third, DType::kFloat32).item(), static_cast<double>(1.0f / 3.0f));
  // Ties to even: 1 + 2^-8 (bf16 tie) -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6.
  const Tensor ties = Tensor::from_doubles({1 + std::ldexp(1.0, -8), 1 + 3 * std::ldexp(1.0, -8)}, {2}, kF64);
  ExpectValues(Cast(ties, DType::kBFloat16), {1.0, 1 + std::ldexp(1.0, -6)}, 0, "bf16 ties");
  // Overflow and round trip.
  EXPECT_TRUE(std::isinf(Cast(Tensor::from_doubles({65520}, {1}), DType::kFloat16).item()));
  EXPECT_EQ(Cast(Tensor::from_doubles({65504}, {1}), DType::kFloat16).item(), 65504);
  const Tensor r = Randn({64}, 2, DType::kFloat32).to(DType::kBFloat16);
  EXPECT_EQ(Cast(Cast(r, DType::kFloat32), DType::kBFloat16).to_doubles(), r.to_doubles());
  const Tensor h = Randn({64}, 3, DType::kFloat32).to(DType::kFloat16);
  EXPECT_EQ(Cast(Cast(h, DType::kFloat64), DType::kFloat16).to_doubles(), h.to_doubles());
  // Float to int64 truncates toward zero; same dtype returns the tensor itself.
  EXPECT_EQ(Cast(Tensor::from_doubles({-1.7, 2.9}, {2}), DType::kInt64).to_int64s(), (std::vector<int64_t>{-1, 2}));
  EXPECT_TRUE(Cast(r, DType::kBFloat16).is_same(r));
}

TEST(OpsCompare, AllCloseAndMaxAbsDiff) {
  const Tensor a = Tensor::from_doubles({1, 2, 3}, {3}, kF64);
  const Tensor b = Tensor::from_doubles({1, 2, 3.001}, {3}, kF64);
  EXPECT_NEAR(MaxAbsDiff(a, b), 0.001, 1e-12);
  EXPECT_FALSE(AllClose(a, b));
  EXPECT_TRUE(AllClose(a, b, 1e-3));
  EXPECT_TRUE(AllClose(a, b, 0, 1e-3 + 1e-12));
  EXPECT_FALSE(AllClose(a, Tensor::zeros({2}, kF64)));
  EXPECT_THROW(MaxAbsDiff(a, Tensor::zeros({2}, kF64)), Error);
  const Tensor n = Tensor::from_doubles({NAN, INFINITY}, {2}, kF64);
  EXPECT_FALSE(AllClose(n, n));
  EXPECT_TRUE(AllClose(n, n, 1e-5, 1e-8, true));
  EXPECT_FALSE(AllClose(n, Tensor::from_doubles({NAN, -INFINITY}, {2}, kF64), 1e-5, 1e-8, true));
  EXPECT_TRUE(std::isnan(MaxAbsDiff(n, a.narrow(0, 0, 2))));
  // Mixed dtypes compare by value.
  EXPECT_TRUE(AllClose(a.to(DType::kBFloat16), a));
}

}  // namespace
}  // namespace fsdp::ops::kernels
