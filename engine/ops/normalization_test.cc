#include "engine/ops/normalization.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/testing/ops_test_util.h"

namespace fsdp::ops::kernels {
namespace {

using testing::ExpectGradientsMatch;
using testing::ExpectValues;
using testing::Randn;

constexpr DType kF64 = DType::kFloat64;

TEST(KernelNorm, LayerNormOfOneTwoThree) {
  const Tensor x = Tensor::from_doubles({1, 2, 3}, {1, 3}, kF64);
  const LayerNormResult r = LayerNorm(x, {3});
  const double rstd = 1.0 / std::sqrt(2.0 / 3.0 + 1e-5);
  ExpectValues(r.output, {-rstd, 0, rstd}, 1e-15, "layer_norm");
  ExpectValues(r.mean, {2}, 1e-15, "mean");
  ExpectValues(r.rstd, {rstd}, 1e-15, "rstd");
  EXPECT_EQ(r.mean.sizes(), (Shape{1, 1}));
  const LayerNormResult a = LayerNorm(x, {3}, Tensor::from_doubles({1, 2, 3}, {3}, kF64),
                                      Tensor::from_doubles({0.5, 0.5, 0.5}, {3}, kF64));
  ExpectValues(a.output, {0.5 - rstd, 0.5, 0.5 + 3 * rstd}, 1e-15, "layer_norm affine");
  // float32: rstd ≈ 1.2247357.
  const LayerNormResult f = LayerNorm(Tensor::from_doubles({1, 2, 3}, {3}), {3});
  EXPECT_NEAR(f.output.to_doubles()[2], 1.2247357, 1e-6);
  EXPECT_THROW(LayerNorm(x, {4}), Error);
  EXPECT_THROW(LayerNorm(x, {3}, Tensor::ones({4}, kF64)), Error);
}

TEST(KernelNorm, LayerNormGradients) {
  const Tensor x = Randn({3, 5}, 1), w = Randn({5}, 2), b = Randn({5}, 3);
  auto fwd = [](const std::vector<Tensor>& in) { return LayerNorm(in[0], {5}, in[1], in[2]).output; };
  auto bwd = [](const Tensor& g, const std::vector<Tensor>& in) {
    const LayerNormResult r = LayerNorm(in[0], {5}, in[1], in[2]);
    const NormGrads n = LayerNormBackward(g, in[0], {5}, r.mean, r.rstd, in[1]);
    return std::vector<Tensor>{n.input, n.weight, n.bias};
  };
  ExpectGradientsMatch(fwd, bwd, {x, w, b}, "layer_norm");
  // Two normalised dims, no affine parameters.
  const Tensor x2 = Randn({2, 2, 3}, 4);
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return LayerNorm(in[0], {2, 3}).output; },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         const LayerNormResult r = LayerNorm(in[0], {2, 3});
                         return std::vector<Tensor>{
                             LayerNormBackward(g, in[0], {2, 3}, r.mean, r.rstd, Tensor(), true, false, false).input};
                       },
                       {x2}, "layer_norm 2 dims");
}

TEST(KernelNorm, RmsNorm) {
  const Tensor x = Tensor::from_doubles({1, 2, 3, 4}, {2, 2}, kF64);
  const RmsNormResult r = RmsNorm(x, {2}, Tensor::from_doubles({1, 2}, {2}, kF64), 1e-6);
  const double r0 = 1 / std::sqrt(2.5 + 1e-6), r1 = 1 / std::sqrt(12.5 + 1e-6);
  ExpectValues(r.output, {r0, 4 * r0, 3 * r1, 8 * r1}, 1e-15, "rms_norm");
  // Default eps: float64's epsilon for float64 input.
  EXPECT_NEAR(RmsNorm(x, {2}).rstd.to_doubles()[0], 1 / std::sqrt(2.5 + 2.220446049250313e-16), 1e-16);
  const Tensor xs = Randn({3, 4}, 5), w = Randn({4}, 6);
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return RmsNorm(in[0], {4}, in[1], 1e-6).output; },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         const RmsNormResult rr = RmsNorm(in[0], {4}, in[1], 1e-6);
                         const NormGrads n = RmsNormBackward(g, in[0], {4}, rr.rstd, in[1]);
                         return std::vector<Tensor>{n.input, n.weight};
                       },
                       {xs, w}, "rms_norm");
}

TEST(KernelNorm, BatchNormRunningStatsAfterOneStep) {
  const Tensor x = Tensor::from_doubles({1, 10, 2, 20, 3, 30, 6, 60}, {4, 2}, kF64);
  Tensor rm = Tensor::zeros({2}, kF64), rv = Tensor::ones({2}, kF64);
  Tensor nbt = Tensor::from_int64s({0}, {});
  const uint64_t version = rm.version();
  const BatchNormResult r = BatchNorm(x, Tensor(), Tensor(), rm, rv, nbt, /*training=*/true, 0.1, 1e-5);
  // Channel 0: values 1, 2, 3, 6: mean 3, biased var 3.5, unbiased var 14/3.
  ExpectValues(rm, {0.3, 3.0}, 1e-12, "running_mean");
  ExpectValues(rv, {0.9 + 0.1 * 14.0 / 3.0, 0.9 + 0.1 * 1400.0 / 3.0}, 1e-12, "running_var");
  EXPECT_EQ(nbt.to_int64s(), (std::vector<int64_t>{1}));
  EXPECT_GT(rm.version(), version);
  const double inv0 = 1 / std::sqrt(3.5 + 1e-5), inv1 = 1 / std::sqrt(350 + 1e-5);
  ExpectValues(r.output.narrow(0, 0, 1), {-2 * inv0, -20 * inv1}, 1e-12, "normalised with batch stats");
  ExpectValues(r.save_mean, {3, 30}, 1e-12, "save_mean");
  // Eval uses the running statistics and does not update them.
  const BatchNormResult e = BatchNorm(x, Tensor(), Tensor(), rm, rv, nbt, /*training=*/false, 0.1, 1e-5);
  ExpectValues(e.output.narrow(0, 0, 1), {(1 - 0.3) / std::sqrt(rv.to_doubles()[0] + 1e-5),
                                          (10 - 3.0) / std::sqrt(rv.to_doubles()[1] + 1e-5)},
               1e-12, "eval");
  EXPECT_EQ(nbt.to_int64s(), (std::vector<int64_t>{1}));
  // momentum = nullopt: cumulative moving average with factor 1 / num_batches_tracked (= 1/2).
  BatchNorm(x, Tensor(), Tensor(), rm, rv, nbt, true, std::nullopt, 1e-5);
  ExpectValues(rm, {0.5 * 0.3 + 0.5 * 3, 0.5 * 3 + 0.5 * 30}, 1e-12, "cumulative");
  EXPECT_THROW(BatchNorm(Tensor::ones({1, 2}, kF64), Tensor(), Tensor(), rm, rv, nbt, true, 0.1, 1e-5), Error);
  EXPECT_THROW(BatchNorm(Tensor::ones({2, 3}, kF64), Tensor(), Tensor(), rm, rv, nbt, true, 0.1, 1e-5), Error);
}

TEST(KernelNorm, BatchNormGradients) {
  const Tensor w = Randn({3}, 7), b = Randn({3}, 8);
  for (const Shape& shape : {Shape{4, 3}, Shape{2, 3, 2}}) {
    const Tensor x = Randn(shape, 9);
    ExpectGradientsMatch(
        [](const std::vector<Tensor>& in) {
          return BatchNorm(in[0], in[1], in[2], Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5).output;
        },
        [](const Tensor& g, const std::vector<Tensor>& in) {
          const BatchNormResult r = BatchNorm(in[0], in[1], in[2], Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
          const NormGrads n = BatchNormBackward(g, in[0], in[1], r.save_mean, r.save_invstd, true);
          return std::vector<Tensor>{n.input, n.weight, n.bias};
        },
        {x, w, b}, "batch_norm training");
    const Tensor rm = Randn({3}, 10), rv = testing::Uniform({3}, 11, 0.5, 2.0);
    ExpectGradientsMatch(
        [rm, rv](const std::vector<Tensor>& in) {
          return BatchNorm(in[0], in[1], in[2], rm, rv, Tensor(), false, 0.1, 1e-5).output;
        },
        [rm, rv](const Tensor& g, const std::vector<Tensor>& in) {
          const BatchNormResult r = BatchNorm(in[0], in[1], in[2], rm, rv, Tensor(), false, 0.1, 1e-5);
          const NormGrads n = BatchNormBackward(g, in[0], in[1], r.save_mean, r.save_invstd, false);
          return std::vector<Tensor>{n.input, n.weight, n.bias};
        },
        {x, w, b}, "batch_norm eval");
  }
}

TEST(KernelNorm, ReducedPrecisionKeepsFloatStatistics) {
  const Tensor x = Randn({2, 8}, 12, DType::kFloat32);
  const LayerNormResult r = LayerNorm(x.to(DType::kBFloat16), {8});
  EXPECT_EQ(r.output.dtype(), DType::kBFloat16);
  EXPECT_EQ(r.mean.dtype(), DType::kFloat32);
  const LayerNormResult ref = LayerNorm(x.to(DType::kBFloat16).to(DType::kFloat32), {8});
  EXPECT_EQ(r.output.to_doubles(), ref.output.to(DType::kBFloat16).to_doubles());
}

}  // namespace
}  // namespace fsdp::ops::kernels
