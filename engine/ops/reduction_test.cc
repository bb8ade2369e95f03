#include "engine/ops/reduction.h"

#include <gtest/gtest.h>

#include "engine/testing/ops_test_util.h"

namespace fsdp::ops::kernels {
namespace {

using testing::ExpectGradientsMatch;
using testing::ExpectValues;
using testing::Randn;

TEST(KernelReduction, SumAndMeanValues) {
  Tensor x = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kFloat64);
  EXPECT_EQ(Sum(x).sizes(), Shape{});
  EXPECT_EQ(Sum(x).item(), 21);
  EXPECT_EQ(Mean(x).item(), 3.5);
  ExpectValues(Sum(x, {0}), {5, 7, 9}, 0, "sum dim 0");
  ExpectValues(Sum(x, {-1}, true), {6, 15}, 0, "sum dim -1 keepdim");
  EXPECT_EQ(Sum(x, {-1}, true).sizes(), (Shape{2, 1}));
  EXPECT_EQ(Sum(x, {0, 1}).sizes(), Shape{});
  EXPECT_EQ(Sum(x, {}).item(), 21);  // an empty dim list reduces everything
  EXPECT_EQ(Sum(x, {}, true).sizes(), (Shape{1, 1}));
  ExpectValues(Mean(x, {1}), {2, 5}, 0, "mean dim 1");
  EXPECT_THROW(Sum(x, {0, -2}), Error);  // duplicate
  EXPECT_THROW(Sum(x, {2}), Error);      // out of range
  EXPECT_THROW(Mean(Tensor::zeros({2}, DType::kInt64)), Error);
  EXPECT_EQ(Sum(Tensor::from_int64s({1, 2, 3}, {3})).to_int64s(), (std::vector<int64_t>{6}));
}

TEST(KernelReduction, MiddleDimsAndEmpty) {
  Tensor x = Randn({2, 3, 4}, 3);
  const std::vector<double> v = x.to_doubles();
  Tensor s = Sum(x, {0, 2});
  ASSERT_EQ(s.sizes(), (Shape{3}));
  for (int j = 0; j < 3; ++j) {
    double e = 0;
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < 4; ++k) e += v[static_cast<size_t>((i * 3 + j) * 4 + k)];
    EXPECT_NEAR(s.to_doubles()[static_cast<size_t>(j)], e, 1e-12);
  }
  EXPECT_EQ(Sum(Tensor::zeros({0, 3}, DType::kFloat64), {0}).to_doubles(), (std::vector<double>{0, 0, 0}));
}

TEST(KernelReduction, ReducedPrecisionMeanAccumulatesInFloat) {
  // 256 ones in bfloat16 sum exactly in float (a bfloat16 accumulator would stall at 256).
  Tensor x = Tensor::ones({300}, DType::kBFloat16);
  EXPECT_EQ(Sum(x).item(), 300);
  EXPECT_EQ(Sum(x).dtype(), DType::kBFloat16);
  EXPECT_EQ(Mean(x).item(), 1);
}

TEST(KernelReduction, Gradients) {
  const Tensor x = Randn({2, 3, 4}, 5);
  for (bool keepdim : {false, true}) {
    for (const std::vector<int64_t>& dims : {std::vector<int64_t>{1}, std::vector<int64_t>{0, 2},
                                             std::vector<int64_t>{-1}}) {
      ExpectGradientsMatch([&](const std::vector<Tensor>& in) { return Sum(in[0], dims, keepdim); },
                           [&](const Tensor& g, const std::vector<Tensor>& in) {
                             return std::vector<Tensor>{SumBackward(g, in[0].sizes(), dims, keepdim)};
                           },
                           {x}, "sum dims");
      ExpectGradientsMatch([&](const std::vector<Tensor>& in) { return Mean(in[0], dims, keepdim); },
                           [&](const Tensor& g, const std::vector<Tensor>& in) {
                             return std::vector<Tensor>{MeanBackward(g, in[0].sizes(), dims, keepdim)};
                           },
                           {x}, "mean dims");
    }
  }
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Sum(in[0]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         return std::vector<Tensor>{SumBackward(g, in[0].sizes())};
                       },
                       {x}, "sum all");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Mean(in[0]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         return std::vector<Tensor>{MeanBackward(g, in[0].sizes())};
                       },
                       {x}, "mean all");
}

}  // namespace
}  // namespace fsdp::ops::kernels
