#include "reference/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "reference/gradient_check.h"
#include "reference/loss.h"

namespace fsdp::reference {
namespace {

using Mat = Matrix<double>;
using Vec = Vector<double>;

Mat M(const RefTensorMap& m, const std::string& name) { return ToMatrix(m.at(name)); }
Vec V(const RefTensorMap& m, const std::string& name) { return ToVector(m.at(name)); }
RefTensor T2(const Mat& m) { return FromMatrix<double>(m, {m.rows(), m.cols()}); }
RefTensor T1(const Vec& v) { return FromVector<double>(v, {v.size()}); }

using Forward = std::function<RefTensor(const RefTensorMap&)>;
using Backward = std::function<RefTensorMap(const RefTensorMap&, const RefTensor&)>;

// Checks `backward` against central differences of L = <forward(point), G> for a random G.
void ExpectGradientsMatchFiniteDifferences(const Forward& forward, const Backward& backward,
                                           const RefTensorMap& point, uint64_t seed) {
  const RefTensor out = forward(point);
  const RefTensor weights = UniformTensor<double>(out.shape, seed, -1.0, 1.0);
  auto objective = [&](const RefTensorMap& m) {
    const RefTensor o = forward(m);
    double l = 0;
    for (int64_t i = 0; i < o.numel(); ++i) l += o[i] * weights[i];
    return l;
  };
  const RefTensorMap numerical = NumericalGradients(objective, point);
  const GradientCheckResult r =
      CompareToNumerical(backward(point, weights), numerical, /*rtol=*/1e-6, /*atol=*/1e-8);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_GT(r.checked_entries, 0);
}

// ---- Hand-computed values ----------------------------------------------------------------------

TEST(LinearTest, TwoByTwoByHand) {
  Mat x(1, 2), w(2, 2);
  x << 1, 2;
  w << 1, 2, 3, 4;
  Vec b(2);
  b << 0.5, -1;
  const Mat y = LinearForward<double>(x, w, &b);
  EXPECT_DOUBLE_EQ(y(0, 0), 5.5);   // 1*1 + 2*2 + 0.5
  EXPECT_DOUBLE_EQ(y(0, 1), 10.0);  // 1*3 + 2*4 - 1
  const LinearGrads<double> g = LinearBackward<double>(x, w, true, Mat::Ones(1, 2));
  EXPECT_DOUBLE_EQ(g.input(0, 0), 4.0);  // dy W = [1+3, 2+4]
  EXPECT_DOUBLE_EQ(g.input(0, 1), 6.0);
  EXPECT_DOUBLE_EQ(g.weight(0, 0), 1.0);  // dyᵀ x = [[1, 2], [1, 2]]
  EXPECT_DOUBLE_EQ(g.weight(0, 1), 2.0);
  EXPECT_DOUBLE_EQ(g.weight(1, 0), 1.0);
  EXPECT_DOUBLE_EQ(g.weight(1, 1), 2.0);
  EXPECT_DOUBLE_EQ(g.bias(0), 1.0);
  EXPECT_DOUBLE_EQ(g.bias(1), 1.0);
}

TEST(LayerNormTest, OneTwoThreeByHand) {
  Mat x(1, 3);
  x << 1, 2, 3;
  const Mat y = LayerNormForward<double>(x, nullptr, nullptr);
  // mean 2, biased variance 2/3: y = [-1, 0, 1] / sqrt(2/3 + 1e-5).
  EXPECT_NEAR(y(0, 0), -1.2247356859083902, 1e-15);
  EXPECT_NEAR(y(0, 1), 0.0, 1e-15);
  EXPECT_NEAR(y(0, 2), 1.2247356859083902, 1e-15);
  Vec w(3), b(3);
  w << 2, 2, 2;
  b << 1, 1, 1;
  const Mat ya = LayerNormForward<double>(x, &w, &b);
  EXPECT_NEAR(ya(0, 2), 2 * 1.2247356859083902 + 1, 1e-14);
}

TEST(RmsNormTest, ThreeFourByHand) {
  Mat x(1, 2);
  x << 3, 4;
  const Mat y = RmsNormForward<double>(x, Vec::Ones(2));
  // mean(x²) = 12.5.
  EXPECT_NEAR(y(0, 0), 0.8485281034827337, 1e-15);
  EXPECT_NEAR(y(0, 1), 1.1313708046436448, 1e-15);
}

TEST(SoftmaxTest, CausalTwoByTwoByHand) {
  Mat s(2, 2);
  s << 1, 2, 3, 4;
  const Mat p = SoftmaxRows<double>(s, /*causal=*/true);
  EXPECT_DOUBLE_EQ(p(0, 0), 1.0);  // query 0 sees key 0 only
  EXPECT_DOUBLE_EQ(p(0, 1), 0.0);
  EXPECT_NEAR(p(1, 0), 0.2689414213699951, 1e-15);
  EXPECT_NEAR(p(1, 1), 0.7310585786300048, 1e-15);
}

TEST(AttentionTest, CausalFirstQuerySeesOnlyFirstValue) {
  Mat q(2, 2), k(2, 2), v(2, 2);
  q << 1, 0, 0, 1;
  k << 0.5, 0.5, -1, 2;
  v << 7, 8, 9, 10;
  const Mat o = AttentionForward<double>(q, k, v, /*causal=*/true, 1.0 / std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(o(0, 0), 7.0);
  EXPECT_DOUBLE_EQ(o(0, 1), 8.0);
  // Query 1: scores [0.5, 2] / sqrt(2).
  const double e0 = std::exp(0.5 / std::sqrt(2.0)), e1 = std::exp(2 / std::sqrt(2.0));
  EXPECT_NEAR(o(1, 0), (7 * e0 + 9 * e1) / (e0 + e1), 1e-14);
}

TEST(ActivationTest, GeluAndReluByHand) {
  Mat x(1, 4);
  x << 1, -1, 0.5, 0;
  const Mat g = GeluForward<double>(x);
  EXPECT_NEAR(g(0, 0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(g(0, 1), -0.15865525393145707, 1e-15);
  EXPECT_NEAR(g(0, 2), 0.34573123063700656, 1e-15);
  EXPECT_EQ(g(0, 3), 0.0);
  const Mat r = ReluForward<double>(x);
  EXPECT_EQ(r(0, 1), 0.0);
  EXPECT_EQ(r(0, 2), 0.5);
  const Mat dr = ReluBackward<double>(x, Mat::Ones(1, 4));
  EXPECT_EQ(dr(0, 0), 1.0);
  EXPECT_EQ(dr(0, 1), 0.0);
  EXPECT_EQ(dr(0, 3), 0.0);  // derivative at 0 is 0, as torch
}

TEST(BatchNormTest, TrainingStatisticsAndRunningUpdateByHand) {
  const RefTensor x({2, 1}, {1, 3});
  BatchNormStats<double> stats{Vec::Zero(1), Vec::Ones(1), 0};
  const RefTensor y = BatchNormForward<double>(x, nullptr, nullptr, &stats, {});
  // mean 2, biased var 1: y = [-1, 1] / sqrt(1 + 1e-5).
  EXPECT_NEAR(y[0], -0.9999950000374997, 1e-15);
  EXPECT_NEAR(y[1], 0.9999950000374997, 1e-15);
  EXPECT_DOUBLE_EQ(stats.running_mean(0), 0.2);  // 0.9 * 0 + 0.1 * 2
  EXPECT_DOUBLE_EQ(stats.running_var(0), 1.1);   // 0.9 * 1 + 0.1 * (unbiased var 2)
  EXPECT_EQ(stats.num_batches_tracked, 1);

  BatchNormOptions eval;
  eval.training = false;
  const RefTensor ye = BatchNormForward<double>(x, nullptr, nullptr, &stats, eval);
  EXPECT_NEAR(ye[0], (1 - 0.2) / std::sqrt(1.1 + 1e-5), 1e-15);
  EXPECT_EQ(stats.num_batches_tracked, 1);  // eval does not count
}

TEST(BatchNormTest, TrainingWithOneValuePerChannelThrows) {
  const RefTensor x({1, 3}, {1, 2, 3});
  BatchNormStats<double> stats{Vec::Zero(3), Vec::Ones(3), 0};
  EXPECT_THROW(BatchNormForward<double>(x, nullptr, nullptr, &stats, {}), std::invalid_argument);
}

TEST(EmbeddingTest, RepeatedIdsAccumulate) {
  Mat table(3, 2);
  table << 1, 2, 3, 4, 5, 6;
  const Mat e = EmbeddingForward<double>(table, {2, 0, 2});
  EXPECT_EQ(e(0, 0), 5);
  EXPECT_EQ(e(1, 1), 2);
  Mat dy(3, 2);
  dy << 1, 1, 10, 10, 100, 100;
  const Mat g = EmbeddingBackward<double>(3, {2, 0, 2}, dy);
  EXPECT_EQ(g(0, 0), 10);
  EXPECT_EQ(g(1, 0), 0);
  EXPECT_EQ(g(2, 0), 101);
  EXPECT_THROW(EmbeddingForward<double>(table, {3}), std::invalid_argument);
}

TEST(CrossEntropyTest, ByHand) {
  Mat logits(2, 2);
  logits << 0, 0, 0, std::log(3.0);
  // Row 0: -log(1/2); row 1 (target 1): -log(3/4).
  const auto sum = CrossEntropy<double>(logits, {0, 1}, Reduction::kSum);
  EXPECT_NEAR(sum.loss, std::log(2.0) - std::log(0.75), 1e-15);
  EXPECT_NEAR(sum.grad_logits(0, 0), -0.5, 1e-15);
  EXPECT_NEAR(sum.grad_logits(0, 1), 0.5, 1e-15);
  EXPECT_NEAR(sum.grad_logits(1, 1), -0.25, 1e-15);
  const auto mean = CrossEntropy<double>(logits, {0, 1}, Reduction::kMean);
  EXPECT_NEAR(mean.loss, sum.loss / 2, 1e-15);
  EXPECT_NEAR(mean.grad_logits(0, 1), 0.25, 1e-15);
  // ignore_index rows drop out of the sum and of the mean's count.
  const auto ignored = CrossEntropy<double>(logits, {0, -100}, Reduction::kMean);
  EXPECT_NEAR(ignored.loss, std::log(2.0), 1e-15);
  EXPECT_EQ(ignored.grad_logits(1, 0), 0.0);
  EXPECT_THROW(CrossEntropy<double>(logits, {0, 2}, Reduction::kSum), std::invalid_argument);
}

// ---- Finite differences ------------------------------------------------------------------------

TEST(LinearTest, GradientsMatchFiniteDifferences) {
  for (bool bias : {true, false}) {
    RefTensorMap p = {{"x", UniformTensor<double>({4, 3}, 1, -1, 1)},
                      {"w", UniformTensor<double>({5, 3}, 2, -1, 1)}};
    if (bias) p["b"] = UniformTensor<double>({5}, 3, -1, 1);
    auto fwd = [bias](const RefTensorMap& m) {
      const Vec b = bias ? V(m, "b") : Vec();
      return T2(LinearForward<double>(M(m, "x"), M(m, "w"), bias ? &b : nullptr));
    };
    auto bwd = [bias](const RefTensorMap& m, const RefTensor& dy) {
      const LinearGrads<double> g =
          LinearBackward<double>(M(m, "x"), M(m, "w"), bias, ToMatrix(dy));
      RefTensorMap out = {{"x", T2(g.input)}, {"w", T2(g.weight)}};
      if (bias) out["b"] = T1(g.bias);
      return out;
    };
    ExpectGradientsMatchFiniteDifferences(fwd, bwd, p, 10);
  }
}

TEST(EmbeddingTest, GradientsMatchFiniteDifferences) {
  const std::vector<int64_t> ids = {1, 3, 1, 0, 4};
  RefTensorMap p = {{"table", UniformTensor<double>({6, 3}, 4, -1, 1)}};
  auto fwd = [&](const RefTensorMap& m) {
    return T2(EmbeddingForward<double>(M(m, "table"), ids));
  };
  auto bwd = [&](const RefTensorMap&, const RefTensor& dy) {
    return RefTensorMap{{"table", T2(EmbeddingBackward<double>(6, ids, ToMatrix(dy)))}};
  };
  ExpectGradientsMatchFiniteDifferences(fwd, bwd, p, 11);
}

TEST(LayerNormTest, GradientsMatchFiniteDifferences) {
  // (weight, bias): affine, bias=False, elementwise_affine=False.
  for (const auto& config : {std::pair{true, true}, {true, false}, {false, false}}) {
    const bool has_w = config.first, has_b = config.second;  // lambdas capture these
    RefTensorMap p = {{"x", UniformTensor<double>({4, 6}, 5, -2, 2)}};
    if (has_w) p["w"] = UniformTensor<double>({6}, 6, 0.5, 1.5);
    if (has_b) p["b"] = UniformTensor<double>({6}, 7, -1, 1);
    auto fwd = [=](const RefTensorMap& m) {
      const Vec w = has_w ? V(m, "w") : Vec(), b = has_b ? V(m, "b") : Vec();
      return T2(LayerNormForward<double>(M(m, "x"), has_w ? &w : nullptr, has_b ? &b : nullptr));
    };
    auto bwd = [=](const RefTensorMap& m, const RefTensor& dy) {
      const Vec w = has_w ? V(m, "w") : Vec();
      const NormGrads<double> g =
          LayerNormBackward<double>(M(m, "x"), has_w ? &w : nullptr, has_b, ToMatrix(dy));
      RefTensorMap out = {{"x", T2(g.input)}};
      if (has_w) out["w"] = T1(g.weight);
      if (has_b) out["b"] = T1(g.bias);
      return out;
    };
    ExpectGradientsMatchFiniteDifferences(fwd, bwd, p, 12);
  }
}

TEST(RmsNormTest, GradientsMatchFiniteDifferences) {
  RefTensorMap p = {{"x", UniformTensor<double>({3, 5}, 8, -2, 2)},
                    {"w", UniformTensor<double>({5}, 9, 0.5, 1.5)}};
  auto fwd = [](const RefTensorMap& m) { return T2(RmsNormForward<double>(M(m, "x"), V(m, "w"))); };
  auto bwd = [](const RefTensorMap& m, const RefTensor& dy) {
    const NormGrads<double> g = RmsNormBackward<double>(M(m, "x"), V(m, "w"), ToMatrix(dy));
    return RefTensorMap{{"x", T2(g.input)}, {"w", T1(g.weight)}};
  };
  ExpectGradientsMatchFiniteDifferences(fwd, bwd, p, 13);
}

TEST(BatchNormTest, GradientsMatchFiniteDifferences) {
  // Training on [N, C] and [N, C, L]; eval with non-trivial running statistics.
  for (const Shape& shape : {Shape{5, 3}, Shape{4, 3, 2}}) {
    for (bool training : {true, false}) {
      const int64_t c = shape[1];
      RefTensorMap p = {{"x", UniformTensor<double>(shape, 20, -2, 2)},
                        {"w", UniformTensor<double>({c}, 21, 0.5, 1.5)},
                        {"b", UniformTensor<double>({c}, 22, -1, 1)}};
      BatchNormStats<double> stats{ToVector(UniformTensor<double>({c}, 23, -0.5, 0.5)),
                                   ToVector(UniformTensor<double>({c}, 24, 0.5, 2)), 3};
      BatchNormOptions opts;
      opts.training = training;
      auto fwd = [&](const RefTensorMap& m) {
        BatchNormStats<double> scratch = stats;
        const Vec w = V(m, "w"), b = V(m, "b");
        return BatchNormForward<double>(m.at("x"), &w, &b, &scratch, opts);
      };
      auto bwd = [&](const RefTensorMap& m, const RefTensor& dy) {
        const Vec w = V(m, "w");
        const BatchNormGrads<double> g =
            BatchNormBackward<double>(m.at("x"), &w, true, &stats, opts, dy);
        return RefTensorMap{{"x", g.input}, {"w", T1(g.weight)}, {"b", T1(g.bias)}};
      };
      ExpectGradientsMatchFiniteDifferences(fwd, bwd, p, 14);
    }
  }
}

TEST(ActivationTest, GradientsMatchFiniteDifferences) {
  // Entries well away from ReLU's kink at 0.
  RefTensor x = UniformTensor<double>({3, 4}, 30, 0.1, 2);
  for (int64_t i = 0; i < x.numel(); i += 2) x[i] = -x[i];
  const RefTensorMap p = {{"x", x}};
  ExpectGradientsMatchFiniteDifferences(
      [](const RefTensorMap& m) { return T2(GeluForward<double>(M(m, "x"))); },
      [](const RefTensorMap& m, const RefTensor& dy) {
        return RefTensorMap{{"x", T2(GeluBackward<double>(M(m, "x"), ToMatrix(dy)))}};
      },
      p, 15);
  ExpectGradientsMatchFiniteDifferences(
      [](const RefTensorMap& m) { return T2(ReluForward<double>(M(m, "x"))); },
      [](const RefTensorMap& m, const RefTensor& dy) {
        return RefTensorMap{{"x", T2(ReluBackward<double>(M(m, "x"), ToMatrix(dy)))}};
      },
      p, 16);
}

TEST(AttentionTest, GradientsMatchFiniteDifferences) {
  // Causal and full attention; a cross-attention shape (Lq != Lk) without the mask.
  for (const auto& config : {std::tuple{4, 4, true}, {4, 4, false}, {3, 5, false}}) {
    const int lq = std::get<0>(config), lk = std::get<1>(config);
    const bool causal = std::get<2>(config);  // captured by the lambdas
    const RefTensorMap p = {{"q", UniformTensor<double>({lq, 3}, 40, -1, 1)},
                            {"k", UniformTensor<double>({lk, 3}, 41, -1, 1)},
                            {"v", UniformTensor<double>({lk, 2}, 42, -1, 1)}};
    const double scale = 1 / std::sqrt(3.0);
    auto fwd = [=](const RefTensorMap& m) {
      return T2(AttentionForward<double>(M(m, "q"), M(m, "k"), M(m, "v"), causal, scale));
    };
    auto bwd = [=](const RefTensorMap& m, const RefTensor& dy) {
      const AttentionGrads<double> g =
          AttentionBackward<double>(M(m, "q"), M(m, "k"), M(m, "v"), causal, scale, ToMatrix(dy));
      return RefTensorMap{{"q", T2(g.q)}, {"k", T2(g.k)}, {"v", T2(g.v)}};
    };
    ExpectGradientsMatchFiniteDifferences(fwd, bwd, p, 17);
  }
}

TEST(AttentionTest, MultiHeadGradientsMatchFiniteDifferencesInBothLayouts) {
  const int64_t batch = 2, heads = 2, seq = 3, embed = 4;
  for (SequenceLayout layout : {SequenceLayout::kBatchFirst, SequenceLayout::kSequenceFirst}) {
    const RefTensorMap p = {{"q", UniformTensor<double>({batch * seq, embed}, 50, -1, 1)},
                            {"k", UniformTensor<double>({batch * seq, embed}, 51, -1, 1)},
                            {"v", UniformTensor<double>({batch * seq, embed}, 52, -1, 1)}};
    auto fwd = [=](const RefTensorMap& m) {
      return T2(MultiHeadAttentionForward<double>(M(m, "q"), M(m, "k"), M(m, "v"), batch, heads,
                                                  layout, true));
    };
    auto bwd = [=](const RefTensorMap& m, const RefTensor& dy) {
      const AttentionGrads<double> g = MultiHeadAttentionBackward<double>(
          M(m, "q"), M(m, "k"), M(m, "v"), batch, heads, layout, true, ToMatrix(dy));
      return RefTensorMap{{"q", T2(g.q)}, {"k", T2(g.k)}, {"v", T2(g.v)}};
    };
    ExpectGradientsMatchFiniteDifferences(fwd, bwd, p, 18);
  }
}

TEST(AttentionTest, MultiHeadMatchesPerHeadAttentionInBatchFirstLayout) {
  // Row b*seq + s, head h = columns [h*hd, (h+1)*hd): compare one (b, h) block by hand.
  const int64_t batch = 2, heads = 2, seq = 3, embed = 4, hd = 2;
  const Mat q = ToMatrix(UniformTensor<double>({batch * seq, embed}, 60, -1, 1));
  const Mat k = ToMatrix(UniformTensor<double>({batch * seq, embed}, 61, -1, 1));
  const Mat v = ToMatrix(UniformTensor<double>({batch * seq, embed}, 62, -1, 1));
  const Mat o =
      MultiHeadAttentionForward<double>(q, k, v, batch, heads, SequenceLayout::kBatchFirst, true);
  const Mat expected =
      AttentionForward<double>(q.block(seq, hd, seq, hd), k.block(seq, hd, seq, hd),
                               v.block(seq, hd, seq, hd), true, 1 / std::sqrt(2.0));
  EXPECT_LT((o.block(seq, hd, seq, hd) - expected).cwiseAbs().maxCoeff(), 1e-15);
}

TEST(CrossEntropyTest, GradientsMatchFiniteDifferences) {
  const std::vector<int64_t> targets = {2, 0, -100, 1};
  for (Reduction red : {Reduction::kMean, Reduction::kSum}) {
    const RefTensorMap p = {{"z", UniformTensor<double>({4, 3}, 70, -2, 2)}};
    auto objective = [&](const RefTensorMap& m) {
      return CrossEntropy<double>(M(m, "z"), targets, red).loss;
    };
    const RefTensorMap numerical = NumericalGradients(objective, p);
    const RefTensorMap analytic = {
        {"z", T2(CrossEntropy<double>(M(p, "z"), targets, red).grad_logits)}};
    const GradientCheckResult r = CompareToNumerical(analytic, numerical, 1e-6, 1e-9);
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(FloatLayersTest, FloatMatchesDoubleClosely) {
  const RefTensor x = UniformTensor<double>({4, 6}, 80, -2, 2);
  const Mat xd = ToMatrix(x);
  const Matrix<float> xf = ToMatrix(CastTensor<float>(x));
  const Mat yd = GeluForward<double>(LayerNormForward<double>(xd, nullptr, nullptr));
  const Matrix<float> yf = GeluForward<float>(LayerNormForward<float>(xf, nullptr, nullptr));
  EXPECT_LT((yf.cast<double>() - yd).cwiseAbs().maxCoeff(), 1e-6);
}

}  // namespace
}  // namespace fsdp::reference
