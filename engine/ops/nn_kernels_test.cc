// Tests of the embedding, dropout and loss kernels.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops/compare.h"
#include "engine/ops/dropout.h"
#include "engine/ops/embedding.h"
#include "engine/ops/loss.h"
#include "engine/testing/ops_test_util.h"

namespace fsdp::ops::kernels {
namespace {

using testing::ExpectGradientsMatch;
using testing::ExpectValues;
using testing::Randn;

constexpr DType kF64 = DType::kFloat64;

TEST(KernelEmbedding, LookupAndScatterAdd) {
  const Tensor w = Tensor::from_doubles({0, 1, 10, 11, 20, 21}, {3, 2}, kF64);
  const Tensor idx = Tensor::from_int64s({2, 0, 2, 1}, {2, 2});
  const Tensor out = Embedding(idx, w);
  EXPECT_EQ(out.sizes(), (Shape{2, 2, 2}));
  ExpectValues(out, {20, 21, 0, 1, 20, 21, 10, 11}, 0, "embedding");
  const Tensor g = Tensor::from_doubles({1, 1, 2, 2, 3, 3, 4, 4}, {2, 2, 2}, kF64);
  ExpectValues(EmbeddingBackward(g, idx, 3), {2, 2, 4, 4, 4, 4}, 0, "scatter-add");
  ExpectValues(EmbeddingBackward(g, idx, 3, 2), {2, 2, 4, 4, 0, 0}, 0, "padding_idx");
  EXPECT_THROW(Embedding(Tensor::from_int64s({3}, {1}), w), Error);
  EXPECT_THROW(Embedding(Tensor::from_doubles({0}, {1}), w), Error);
  ExpectGradientsMatch([idx](const std::vector<Tensor>& in) { return Embedding(idx, in[0]); },
                       [idx](const Tensor& gr, const std::vector<Tensor>& in) {
                         return std::vector<Tensor>{EmbeddingBackward(gr, idx, in[0].size(0))};
                       },
                       {Randn({3, 2}, 1)}, "embedding");
}

TEST(KernelDropout, DeterministicForAFixedSeed) {
  const Tensor x = Randn({1000}, 2);
  Generator g1(7), g2(7);
  const DropoutResult a = Dropout(x, 0.5, g1), b = Dropout(x, 0.5, g2);
  EXPECT_EQ(a.mask.to_doubles(), b.mask.to_doubles());
  EXPECT_EQ(g1.offset(), 250u);
  int kept = 0;
  for (double m : a.mask.to_doubles()) {
    EXPECT_TRUE(m == 0.0 || m == 2.0);
    kept += m != 0.0;
  }
  EXPECT_NEAR(kept / 1000.0, 0.5, 0.06);
  // The mask is a function of (seed, offset): element i uses word i % 4 of block offset + i / 4.
  Generator g3(7);
  g3.set_offset(1);
  const Tensor shifted = DropoutMask({996}, 0.5, kF64, g3);
  const std::vector<double> full = a.mask.to_doubles(), part = shifted.to_doubles();
  for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], full[i + 4]);
  // The next draw differs.
  EXPECT_NE(Dropout(x, 0.5, g1).mask.to_doubles(), a.mask.to_doubles());
  // p = 0 keeps everything; p = 1 drops everything.
  Generator g4(7);
  ExpectValues(Dropout(x, 0.0, g4).output, x.to_doubles(), 0, "p=0");
  EXPECT_EQ(MaxAbsDiff(Dropout(x, 1.0, g4).output, Tensor::zeros({1000}, kF64)), 0.0);
  EXPECT_THROW(Dropout(x, 1.5, g4), Error);
  // The scale is rounded to the input dtype, like PyTorch's noise.div_(1 - p).
  Generator g5(1);
  const DropoutResult h = Dropout(Tensor::ones({64}, DType::kBFloat16), 0.1, g5);
  for (double m : h.mask.to_doubles()) EXPECT_TRUE(m == 0.0 || m == 1.109375) << m;
  ExpectValues(DropoutBackward(Tensor::ones({64}, kF64), h.mask), h.mask.to_doubles(), 0, "backward");
}

TEST(KernelLoss, CrossEntropyTwoClasses) {
  const Tensor logits = Tensor::from_doubles({1, 2, 1, 2}, {2, 2}, kF64);
  const Tensor target = Tensor::from_int64s({1, 0}, {2});
  const double l1 = std::log1p(std::exp(-1.0)), l0 = 1 + l1;  // 0.3132616875182228, 1.3132616875182228
  EXPECT_NEAR(CrossEntropy(logits, target, Reduction::kNone).to_doubles()[0], 0.3132616875182228, 1e-15);
  ExpectValues(CrossEntropy(logits, target, Reduction::kNone), {l1, l0}, 1e-15, "none");
  EXPECT_NEAR(CrossEntropy(logits, target, Reduction::kSum).item(), l0 + l1, 1e-15);
  EXPECT_NEAR(CrossEntropy(logits, target).item(), (l0 + l1) / 2, 1e-15);
  const double s = 1 / (1 + std::exp(1.0));  // softmax of the smaller logit: 0.2689414213699951
  ExpectValues(CrossEntropyBackward(Tensor::ones({}, kF64), logits, target),
               {s / 2, -s / 2, (s - 1) / 2, (1 - s) / 2}, 1e-15, "mean gradient");
  // ignore_index drops a row from the mean.
  const Tensor ignored = Tensor::from_int64s({1, -100}, {2});
  EXPECT_NEAR(CrossEntropy(logits, ignored).item(), l1, 1e-15);
  EXPECT_TRUE(std::isnan(CrossEntropy(logits, Tensor::from_int64s({-100, -100}, {2})).item()));
  EXPECT_THROW(CrossEntropy(logits, Tensor::from_int64s({2, 0}, {2})), Error);
  EXPECT_THROW(ParseReduction("avg"), Error);
}

TEST(KernelLoss, Gradients) {
  const Tensor logits = Randn({4, 5}, 3);
  const Tensor target = Tensor::from_int64s({1, 4, -100, 0}, {4});
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    ExpectGradientsMatch([&](const std::vector<Tensor>& in) { return CrossEntropy(in[0], target, red); },
                         [&](const Tensor& g, const std::vector<Tensor>& in) {
                           return std::vector<Tensor>{CrossEntropyBackward(g, in[0], target, red)};
                         },
                         {logits}, "cross_entropy");
    ExpectGradientsMatch([&](const std::vector<Tensor>& in) { return NllLoss(in[0], target, red); },
                         [&](const Tensor& g, const std::vector<Tensor>& in) {
                           return std::vector<Tensor>{NllLossBackward(g, in[0], target, red)};
                         },
                         {logits}, "nll_loss");
  }
}

}  // namespace
}  // namespace fsdp::ops::kernels
