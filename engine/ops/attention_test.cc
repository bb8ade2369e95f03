#include "engine/ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops/activation.h"
#include "engine/ops/compare.h"
#include "engine/ops/linalg.h"
#include "engine/ops/shape_ops.h"
#include "engine/testing/ops_test_util.h"

namespace fsdp::ops::kernels {
namespace {

using testing::ExpectGradientsMatch;
using testing::ExpectValues;
using testing::Randn;

constexpr DType kF64 = DType::kFloat64;

TEST(KernelAttention, CausalAveragesThePrefix) {
  // Zero queries and keys: uniform attention over the visible keys.
  const Tensor q = Tensor::zeros({1, 1, 3, 2}, kF64), k = Tensor::zeros({1, 1, 3, 2}, kF64);
  const Tensor v = Tensor::from_doubles({1, 10, 2, 20, 3, 30}, {1, 1, 3, 2}, kF64);
  const AttentionResult causal = ScaledDotProductAttention(q, k, v, Tensor(), 0.0, true);
  ExpectValues(causal.output, {1, 10, 1.5, 15, 2, 20}, 1e-15, "causal");
  ExpectValues(causal.attn, {1, 0, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-15, "causal softmax");
  const AttentionResult full = ScaledDotProductAttention(q, k, v);
  ExpectValues(full.output, {2, 20, 2, 20, 2, 20}, 1e-14, "non-causal");
  EXPECT_DOUBLE_EQ(full.scale, 1 / std::sqrt(2.0));
  EXPECT_THROW(ScaledDotProductAttention(q, k, v, Tensor::zeros({3, 3}, kF64), 0.0, true), Error);
  EXPECT_THROW(ScaledDotProductAttention(q, k, Tensor::zeros({1, 1, 2, 2}, kF64)), Error);
}

TEST(KernelAttention, MatchesTheMathDefinition) {
  const Tensor q = Randn({2, 2, 4, 3}, 1), k = Randn({2, 2, 5, 3}, 2), v = Randn({2, 2, 5, 2}, 3);
  const Tensor mask = Randn({4, 5}, 4);
  const AttentionResult r = ScaledDotProductAttention(q, k, v, mask, 0.0, false, 0.3);
  const Tensor s = Matmul(q, Transpose(k, -2, -1));
  Tensor scores = Tensor::empty(s.sizes(), kF64);
  {
    const std::vector<double> sv = s.to_doubles(), mv = mask.to_doubles();
    std::vector<double> out(sv.size());
    for (size_t i = 0; i < sv.size(); ++i) out[i] = sv[i] * 0.3 + mv[i % mv.size()];
    scores = Tensor::from_doubles(out, s.sizes(), kF64);
  }
  const Tensor ref = Matmul(Softmax(scores, -1), v);
  EXPECT_LT(MaxAbsDiff(r.output, ref), 1e-14);
}

TEST(KernelAttention, Gradients) {
  const Tensor q = Randn({1, 2, 3, 4}, 5), k = Randn({1, 2, 3, 4}, 6), v = Randn({1, 2, 3, 2}, 7);
  for (bool causal : {false, true}) {
    ExpectGradientsMatch(
        [causal](const std::vector<Tensor>& in) {
          return ScaledDotProductAttention(in[0], in[1], in[2], Tensor(), 0.0, causal).output;
        },
        [causal](const Tensor& g, const std::vector<Tensor>& in) {
          const AttentionResult r = ScaledDotProductAttention(in[0], in[1], in[2], Tensor(), 0.0, causal);
          const AttentionGrads a =
              ScaledDotProductAttentionBackward(g, in[0], in[1], in[2], r.attn, r.dropout_mask, r.scale);
          return std::vector<Tensor>{a.q, a.k, a.v};
        },
        {q, k, v}, causal ? "sdpa causal" : "sdpa");
  }
  // Additive mask (with its gradient) and dropout drawn from a fixed generator state.
  const Tensor mask = Randn({1, 3, 3}, 8);
  ExpectGradientsMatch(
      [](const std::vector<Tensor>& in) {
        Generator gen(42);
        return ScaledDotProductAttention(in[0], in[1], in[2], in[3], 0.4, false, 0.7, &gen).output;
      },
      [](const Tensor& g, const std::vector<Tensor>& in) {
        Generator gen(42);
        const AttentionResult r = ScaledDotProductAttention(in[0], in[1], in[2], in[3], 0.4, false, 0.7, &gen);
        const AttentionGrads a = ScaledDotProductAttentionBackward(g, in[0], in[1], in[2], r.attn, r.dropout_mask,
                                                                   r.scale, true, true, true, true, in[3].sizes(),
                                                                   kF64);
        return std::vector<Tensor>{a.q, a.k, a.v, a.attn_mask};
      },
      {q, k, v, mask}, "sdpa mask + dropout");
}

TEST(KernelAttention, DropoutIsSeeded) {
  const Tensor q = Randn({1, 1, 8, 4}, 9), k = Randn({1, 1, 8, 4}, 10), v = Randn({1, 1, 8, 4}, 11);
  Generator g1(3), g2(3);
  const AttentionResult a = ScaledDotProductAttention(q, k, v, Tensor(), 0.5, true, std::nullopt, &g1);
  const AttentionResult b = ScaledDotProductAttention(q, k, v, Tensor(), 0.5, true, std::nullopt, &g2);
  EXPECT_EQ(MaxAbsDiff(a.output, b.output), 0.0);
  EXPECT_EQ(g1.offset(), 16u);  // 64 mask elements, 4 per Philox block
  const AttentionResult c = ScaledDotProductAttention(q, k, v, Tensor(), 0.5, true, std::nullopt, &g1);
  EXPECT_GT(MaxAbsDiff(a.output, c.output), 0.0);
  EXPECT_THROW(ScaledDotProductAttention(q, k, v, Tensor(), 0.5), Error);  // no generator
}

}  // namespace
}  // namespace fsdp::ops::kernels
