#include "engine/functional/functional.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/core/rank_context.h"
#include "engine/ops/compare.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/normalization.h"
#include "engine/testing/ops_test_util.h"

namespace fsdp {
namespace {

using ops::testing::Randn;
using ops::testing::Uniform;

constexpr DType kF64 = DType::kFloat64;

using LossFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Builds the loss from leaves that require grad, runs backward, and compares each leaf's
// .grad() with central finite differences of the same loss (evaluated under no_grad).
void ExpectLeafGradsMatch(const LossFn& loss_fn, const std::vector<Tensor>& values, const std::string& what,
                          double h = 1e-6, double tol = 1e-6) {
  std::vector<Tensor> leaves;
  for (const Tensor& v : values) {
    Tensor leaf = v.clone();
    if (IsFloatingPoint(leaf.dtype())) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  Tensor loss = loss_fn(leaves);
  ASSERT_EQ(loss.numel(), 1) << what;
  ASSERT_NE(loss.grad_fn(), nullptr) << what;
  loss.backward();
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!IsFloatingPoint(values[i].dtype())) continue;
    const Tensor grad = leaves[i].grad();
    ASSERT_TRUE(grad.defined()) << what << ": leaf " << i << " got no gradient";
    ASSERT_EQ(grad.sizes(), values[i].sizes()) << what << ": leaf " << i;
    const std::vector<double> ana = grad.to_doubles();
    for (int64_t j = 0; j < values[i].numel(); ++j) {
      std::vector<Tensor> probe = values;
      probe[i] = values[i].clone();
      double* p = probe[i].data<double>();
      const double x0 = p[j];
      p[j] = x0 + h;
      const double lp = loss_fn(probe).item();
      p[j] = x0 - h;
      const double lm = loss_fn(probe).item();
      const double numeric = (lp - lm) / (2 * h);
      EXPECT_NEAR(ana[static_cast<size_t>(j)], numeric, tol * (1 + std::fabs(numeric)))
          << what << ": d loss / d leaf " << i << " element " << j;
    }
  }
}

std::string Name(const Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : "<none>"; }
std::string EdgeName(const std::shared_ptr<autograd::Node>& n, size_t i) {
  const autograd::Edge& e = n->next_edge(i);
  return e.is_valid() ? e.function->name() : "<invalid>";
}

// ---- Gradchecks -------------------------------------------------------------------------------

TEST(FunctionalGradcheck, LinearGeluLayerNormSum) {
  ExpectLeafGradsMatch(
      [](const std::vector<Tensor>& p) {
        return sum(layer_norm(gelu(linear(p[0], p[1], p[2])), {4}, p[3], p[4]));
      },
      {Randn({3, 5}, 1), Randn({4, 5}, 2), Randn({4}, 3), Randn({4}, 4), Randn({4}, 5)}, "linear-gelu-ln");
}

TEST(FunctionalGradcheck, MlpOnBatchedInput) {
  // relu(out_proj(relu(in_proj(x)))) on [2, 3, 4] input: the flatten path of linear.
  ExpectLeafGradsMatch(
      [](const std::vector<Tensor>& p) {
        const Tensor h = relu(linear(p[0], p[1], p[2]));
        return mean(relu(linear(h, p[3], p[4])));
      },
      {Randn({2, 3, 4}, 6), Randn({6, 4}, 7), Randn({6}, 8), Randn({4, 6}, 9), Randn({4}, 10)}, "mlp");
  ExpectLeafGradsMatch([](const std::vector<Tensor>& p) { return sum(linear(p[0], p[1])); },
                       {Randn({2, 3, 4}, 11), Randn({5, 4}, 12)}, "linear no bias 3-D");
  ExpectLeafGradsMatch([](const std::vector<Tensor>& p) { return sum(linear(p[0], p[1], p[2]) * p[0].sizes()[0]); },
                       {Randn({4}, 13), Randn({3, 4}, 14), Randn({3}, 15)}, "linear 1-D input");
}

TEST(FunctionalGradcheck, TinyTransformerWithTiedOutput) {
  const int64_t vocab = 5, dim = 4, heads = 2, seq = 3, bsz = 2;
  const Tensor tokens = Tensor::from_int64s({0, 3, 4, 1, 1, 2}, {bsz, seq});
  const Tensor targets = Tensor::from_int64s({3, 4, 1, 1, 2, 0}, {bsz * seq});
  auto model = [=](const std::vector<Tensor>& p) {
    // p: tok_emb [V, D], pos_emb [S, D], ln w, ln b, wq, wk, wv, wo, w1, b1, w2, b2
    Tensor h = embedding(tokens, p[0]) + embedding(Tensor::arange(seq), p[1]);
    const Tensor x = layer_norm(h, {dim}, p[2], p[3]);
    auto heads_of = [&](const Tensor& t) { return transpose(view(t, {bsz, seq, heads, dim / heads}), 1, 2); };
    const Tensor q = heads_of(linear(x, p[4])), k = heads_of(linear(x, p[5])), v = heads_of(linear(x, p[6]));
    const Tensor o = reshape(transpose(scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true), 1, 2),
                             {bsz, seq, dim});
    h = h + linear(o, p[7]);
    h = h + linear(gelu(linear(layer_norm(h, {dim}, p[2], p[3]), p[8], p[9])), p[10], p[11]);
    const Tensor logits = to(linear(layer_norm(h, {dim}), p[0]), DType::kFloat64);  // tied with tok_emb
    return cross_entropy(view(logits, {-1, vocab}), targets);
  };
  ExpectLeafGradsMatch(model,
                       {Randn({vocab, dim}, 20), Randn({seq, dim}, 21), Randn({dim}, 22), Randn({dim}, 23),
                        Randn({dim, dim}, 24), Randn({dim, dim}, 25), Randn({dim, dim}, 26), Randn({dim, dim}, 27),
                        Randn({8, dim}, 28), Randn({8}, 29), Randn({dim, 8}, 30), Randn({dim}, 31)},
                       "transformer");
}

TEST(FunctionalGradcheck, NormsAndLosses) {
  ExpectLeafGradsMatch([](const std::vector<Tensor>& p) { return sum(rms_norm(p[0], {4}, p[1], 1e-6) * p[2]); },
                       {Randn({3, 4}, 40), Randn({4}, 41), Randn({3, 4}, 42)}, "rms_norm");
  ExpectLeafGradsMatch(
      [](const std::vector<Tensor>& p) {
        return sum(batch_norm(p[0], Tensor(), Tensor(), p[1], p[2], true) * p[3]);
      },
      {Randn({4, 3, 2}, 43), Randn({3}, 44), Randn({3}, 45), Randn({4, 3, 2}, 46)}, "batch_norm");
  const Tensor targets = Tensor::from_int64s({2, 0, 1}, {3});
  ExpectLeafGradsMatch([targets](const std::vector<Tensor>& p) { return cross_entropy(p[0], targets, "sum"); },
                       {Randn({3, 4}, 47)}, "cross_entropy sum");
  ExpectLeafGradsMatch(
      [](const std::vector<Tensor>& p) { return sum(softmax(p[0], 0) * p[1]) + sum(log_softmax(p[0], -1) * p[1]); },
      {Randn({3, 4}, 48), Randn({3, 4}, 49)}, "softmaxes");
}

TEST(FunctionalGradcheck, ArithmeticAndScalars) {
  ExpectLeafGradsMatch(
      [](const std::vector<Tensor>& p) {
        const Tensor a = p[0], b = p[1];
        Tensor y = (2.0 - a) * b + a / b - 3.0 / b + pow(b, 3.0) + exp(a) + log(b) + sqrt(b) + rsqrt(b);
        y = y + neg(a) * 0.5 + (a - 1.0) / 4.0 + sub(a, b, 2.0) + add(a, b, 0.3) + reciprocal(b);
        return mean(y) + sum(mul(a, 2.0)) + sum(div(a, 2.0));
      },
      {Randn({2, 3}, 50), Uniform({2, 3}, 51, 0.5, 2.0)}, "arithmetic");
  // Broadcasting both ways.
  ExpectLeafGradsMatch([](const std::vector<Tensor>& p) { return sum((p[0] + p[1]) * p[2] / (p[3] + 3.0)); },
                       {Randn({2, 1, 3}, 52), Randn({4, 1}, 53), Randn({3}, 54), Uniform({}, 55, 0.5, 1.0)},
                       "broadcasting");
}

TEST(FunctionalGradcheck, MatmulVariants) {
  auto check = [](const Shape& sa, const Shape& sb, uint64_t seed) {
    ExpectLeafGradsMatch([](const std::vector<Tensor>& p) { return sum(matmul(p[0], p[1]) * 1.5); },
                         {Randn(sa, seed), Randn(sb, seed + 1)}, "matmul " + ShapeStr(sa) + " @ " + ShapeStr(sb));
  };
  check({3}, {3}, 60);
  check({2, 3}, {3}, 61);
  check({3}, {3, 2}, 62);
  check({2, 3}, {3, 4}, 63);
  check({2, 2, 3}, {3, 4}, 64);
  check({2, 2, 3}, {3}, 65);
  check({2, 1, 2, 3}, {3, 3, 2}, 66);
  check({3}, {2, 3, 2}, 67);
  check({2, 3}, {2, 3, 2}, 68);
  ExpectLeafGradsMatch([](const std::vector<Tensor>& p) { return sum(bmm(p[0], p[1])) + sum(addmm(p[2], p[3], t(p[4]))); },
                       {Randn({2, 2, 3}, 69), Randn({2, 3, 2}, 70), Randn({2}, 71), Randn({3, 4}, 72), Randn({2, 4}, 73)},
                       "bmm/addmm/t");
  ExpectLeafGradsMatch([](const std::vector<Tensor>& p) { return sum(mm(p[0], p[1])) + dot(p[2], p[2]) + sum(mv(p[0], p[2])); },
                       {Randn({2, 3}, 74), Randn({3, 2}, 75), Randn({3}, 76)}, "mm/dot/mv");
}

TEST(FunctionalGradcheck, ShapeOps) {
  ExpectLeafGradsMatch(
      [](const std::vector<Tensor>& p) {
        const Tensor x = p[0];  // [2, 3, 4]
        Tensor y = permute(x, {2, 0, 1}) * p[1];                                  // [4, 2, 3]
        Tensor z = sum(narrow(x, 1, 1, 2) * 2.0) + sum(select(x, 2, -1) * 3.0);  // copies
        z = z + sum(select(x, 0, 1)) + sum(narrow(x, 0, 1, 1) * 0.5);            // aliases
        std::vector<Tensor> parts = chunk(x, 2, 2);                              // dim 2: copies
        z = z + sum(parts[1] * parts[1]);
        std::vector<Tensor> rows = split(x, std::vector<int64_t>{1, 1}, 0);
        z = z + sum(rows[0] * 4.0);  // rows[1] unused: its gradient is materialised as zeros
        z = z + sum(cat({squeeze(unsqueeze(flatten(x, 1), 0), 0), expand(p[2], {2, 12})}, 0) * 0.1);
        return sum(y) + z + sum(clone(transpose(x, 0, 2)) * p[3]);
      },
      {Randn({2, 3, 4}, 80), Randn({4, 2, 3}, 81), Randn({1, 12}, 82), Randn({4, 3, 2}, 83)}, "shape ops");
  // A cast's gradient is cast back to the input's dtype.
  Tensor x = Randn({2, 3}, 84).set_requires_grad(true);
  sum(mul(to(x, DType::kFloat32), 3.0)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kF64);
  EXPECT_EQ(x.grad().to_doubles(), std::vector<double>(6, 3.0));
}

TEST(FunctionalGradcheck, DropoutAndAttentionWithDropout) {
  ExpectLeafGradsMatch(
      [](const std::vector<Tensor>& p) {
        Generator g(9);
        return sum(dropout(p[0], 0.5, true, &g) * p[1]);
      },
      {Randn({4, 5}, 90), Randn({4, 5}, 91)}, "dropout");
  ExpectLeafGradsMatch(
      [](const std::vector<Tensor>& p) {
        Generator g(10);
        return sum(scaled_dot_product_attention(p[0], p[1], p[2], p[3], 0.3, false, std::nullopt, &g) * p[4]);
      },
      {Randn({1, 2, 3, 2}, 92), Randn({1, 2, 4, 2}, 93), Randn({1, 2, 4, 3}, 94), Randn({3, 4}, 95),
       Randn({1, 2, 3, 3}, 96)},
      "sdpa dropout + mask");
}

TEST(FunctionalGradcheck, ReducedPrecisionLeafGetsItsDtype) {
  Tensor w = Randn({3, 4}, 100, DType::kBFloat16).set_requires_grad(true);
  Tensor x = Randn({2, 4}, 101, DType::kFloat32);
  Tensor loss = sum(to(linear(to(x, DType::kBFloat16), w), DType::kFloat32));
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::kBFloat16);
  // d/dW sum(x Wᵀ) = column sums of x, rounded to bfloat16.
  const std::vector<double> xv = x.to(DType::kBFloat16).to_doubles();
  const std::vector<double> gv = w.grad().to_doubles();
  for (int j = 0; j < 4; ++j) {
    const double col = xv[static_cast<size_t>(j)] + xv[static_cast<size_t>(4 + j)];
    EXPECT_NEAR(gv[static_cast<size_t>(j)], col, std::fabs(col) * 1e-2 + 1e-6);
  }
}

// ---- Graph structure --------------------------------------------------------------------------

TEST(FunctionalGraph, LinearDecomposesLikePyTorch) {
  Tensor w = Randn({3, 4}, 1).set_requires_grad(true);
  Tensor b = Randn({3}, 2).set_requires_grad(true);
  Tensor x2 = Randn({2, 4}, 3).set_requires_grad(true);
  Tensor y = linear(x2, w, b);
  ASSERT_EQ(Name(y), "AddmmBackward0");
  auto addmm_node = y.grad_fn();
  ASSERT_EQ(addmm_node->num_outputs(), 3u);
  EXPECT_EQ(EdgeName(addmm_node, 0), "AccumulateGrad");
  EXPECT_EQ(EdgeName(addmm_node, 1), "AccumulateGrad");
  EXPECT_EQ(EdgeName(addmm_node, 2), "TBackward0");
  EXPECT_LT(addmm_node->next_edge(2).function->sequence_nr(), addmm_node->sequence_nr());
  EXPECT_EQ(addmm_node->next_edge(2).function->sequence_nr() + 1, addmm_node->sequence_nr());

  Tensor y3 = linear(Randn({2, 3, 4}, 4), w, b);
  EXPECT_EQ(Name(y3), "ViewBackward0");
  EXPECT_EQ(y3.sizes(), (Shape{2, 3, 3}));
  auto inner = y3.grad_fn()->next_edge(0).function;
  EXPECT_EQ(inner->name(), "AddmmBackward0");
  EXPECT_EQ(EdgeName(inner, 1), "<invalid>");  // the input needs no grad
  EXPECT_EQ(EdgeName(inner, 2), "TBackward0");

  Tensor n2 = linear(x2, w);
  EXPECT_EQ(Name(n2), "MmBackward0");
  EXPECT_EQ(EdgeName(n2.grad_fn(), 1), "TBackward0");
  Tensor n3 = linear(Randn({2, 3, 4}, 5), w);
  EXPECT_EQ(Name(n3), "UnsafeViewBackward0");
  auto mm_node = n3.grad_fn()->next_edge(0).function;
  EXPECT_EQ(mm_node->name(), "MmBackward0");
  EXPECT_EQ(EdgeName(mm_node, 1), "TBackward0");
  // T is created before the input's reshape: T < View < Mm < UnsafeView.
  EXPECT_LT(mm_node->next_edge(1).function->sequence_nr(), mm_node->sequence_nr());
}

TEST(FunctionalGraph, NodeNames) {
  Tensor x = Randn({2, 3}, 10).set_requires_grad(true);
  EXPECT_EQ(Name(x + 1.0), "AddBackward0");
  EXPECT_EQ(Name(x * 2.0), "MulBackward0");
  EXPECT_EQ(Name(x / 2.0), "DivBackward0");
  EXPECT_EQ(Name(x - 1.0), "SubBackward0");
  EXPECT_EQ(Name(2.0 - x), "RsubBackward1");
  Tensor r = 2.0 / x;
  EXPECT_EQ(Name(r), "MulBackward0");
  EXPECT_EQ(EdgeName(r.grad_fn(), 0), "ReciprocalBackward0");
  EXPECT_EQ(Name(-x), "NegBackward0");
  EXPECT_EQ(Name(pow(x, 2.0)), "PowBackward0");
  EXPECT_EQ(Name(relu(x)), "ReluBackward0");
  EXPECT_EQ(Name(gelu(x)), "GeluBackward0");
  EXPECT_EQ(Name(softmax(x, -1)), "SoftmaxBackward0");
  EXPECT_EQ(Name(sum(x)), "SumBackward0");
  EXPECT_EQ(Name(sum(x, {1})), "SumBackward1");
  EXPECT_EQ(Name(mean(x)), "MeanBackward0");
  EXPECT_EQ(Name(mean(x, {-1}, true)), "MeanBackward1");
  EXPECT_EQ(Name(transpose(x, 0, 1)), "TransposeBackward0");
  EXPECT_EQ(Name(permute(x, {1, 0})), "PermuteBackward0");
  EXPECT_EQ(Name(view(x, {6})), "ViewBackward0");
  EXPECT_EQ(Name(flatten(x)), "ViewBackward0");
  EXPECT_TRUE(flatten(x, 1, 1).is_same(x));
  EXPECT_EQ(Name(unsqueeze(x, 0)), "UnsqueezeBackward0");
  EXPECT_EQ(Name(squeeze(x, 0)), "SqueezeBackward1");
  EXPECT_EQ(Name(narrow(x, 1, 0, 2)), "SliceBackward0");
  EXPECT_EQ(Name(select(x, 0, 1)), "SelectBackward0");
  EXPECT_EQ(Name(expand(x, {2, 2, 3})), "ExpandBackward0");
  EXPECT_EQ(Name(cat({x, x}, 0)), "CatBackward0");
  EXPECT_EQ(Name(clone(x)), "CloneBackward0");
  EXPECT_EQ(Name(to(x, DType::kFloat32)), "ToCopyBackward0");
  EXPECT_TRUE(to(x, kF64).is_same(x));
  EXPECT_EQ(Name(layer_norm(x, {3})), "NativeLayerNormBackward0");
  EXPECT_EQ(Name(embedding(Tensor::from_int64s({1, 0}, {2}), x)), "EmbeddingBackward0");
  EXPECT_EQ(Name(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true)), "NativeBatchNormBackward0");
  const Tensor target = Tensor::from_int64s({0, 2}, {2});
  Tensor ce = cross_entropy(x, target);
  EXPECT_EQ(Name(ce), "NllLossBackward0");
  EXPECT_EQ(EdgeName(ce.grad_fn(), 0), "LogSoftmaxBackward0");
  Tensor q = Randn({1, 1, 2, 3}, 11).set_requires_grad(true);
  EXPECT_EQ(Name(scaled_dot_product_attention(q, q, q)), "ScaledDotProductFlashAttentionForCpuBackward0");
  // chunk: one SplitBackward0 node, one output slot per piece.
  std::vector<Tensor> pieces = chunk(x, 2, 0);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(Name(pieces[0]), "SplitBackward0");
  EXPECT_EQ(pieces[0].grad_fn(), pieces[1].grad_fn());
  EXPECT_EQ(pieces[1].output_nr(), 1u);
  EXPECT_EQ(Name(split(x, std::vector<int64_t>{1, 1}, 0)[0]), "SplitWithSizesBackward0");
}

TEST(FunctionalGraph, RmsNormDecomposition) {
  Tensor x = Randn({2, 4}, 12).set_requires_grad(true);
  Tensor w = Tensor::ones({4}, kF64).set_requires_grad(true);
  Tensor y = rms_norm(x, {4}, w, 1e-6);
  std::vector<std::string> names;
  std::shared_ptr<autograd::Node> n = y.grad_fn();
  // Walk the first edge chain: Mul(weight) <- Mul(x * r) -> ... r = Rsqrt <- Add <- Mean <- Pow.
  ASSERT_EQ(n->name(), "MulBackward0");
  n = n->next_edge(0).function;
  ASSERT_EQ(n->name(), "MulBackward0");
  n = n->next_edge(1).function;
  for (const char* expected : {"RsqrtBackward0", "AddBackward0", "MeanBackward1", "PowBackward0"}) {
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->name(), expected);
    n = n->next_edge(0).function;
  }
  EXPECT_EQ(n->name(), "AccumulateGrad");
  // Values match the fused kernel.
  EXPECT_LT(ops::kernels::MaxAbsDiff(y, ops::kernels::RmsNorm(x, {4}, w, 1e-6).output), 1e-15);
}

TEST(FunctionalGraph, RecordingRules) {
  Tensor x = Randn({2, 3}, 13).set_requires_grad(true);
  Tensor c = Randn({2, 3}, 14);
  EXPECT_EQ(relu(c).grad_fn(), nullptr);  // no input requires grad
  {
    autograd::NoGradGuard no_grad;
    EXPECT_EQ(relu(x).grad_fn(), nullptr);
    EXPECT_FALSE(relu(x).requires_grad());
  }
  // Dropout is the identity (no node) when p == 0 or in eval mode; on CPU it is MulBackward0.
  EXPECT_TRUE(dropout(x, 0.0, true).is_same(x));
  EXPECT_TRUE(dropout(x, 0.5, false).is_same(x));
  Tensor d = dropout(x, 0.5, true);
  EXPECT_EQ(Name(d), "MulBackward0");
  EXPECT_EQ(EdgeName(d.grad_fn(), 1), "<invalid>");
  // Views alias the input's storage; transposes copy.
  EXPECT_EQ(view(x, {3, 2}).storage(), x.storage());
  EXPECT_EQ(narrow(x, 0, 1, 1).storage(), x.storage());
  EXPECT_NE(transpose(x, 0, 1).storage(), x.storage());
  // Saved tensors are released after backward: a second backward throws.
  Tensor loss = sum(exp(x));
  loss.backward();
  EXPECT_THROW(loss.backward(), Error);
  // With retain_graph, gradients accumulate.
  Tensor x2 = Randn({3}, 15).set_requires_grad(true);
  Tensor l2 = sum(x2 * x2);
  l2.backward(Tensor(), true);
  l2.backward();
  EXPECT_LT(ops::kernels::MaxAbsDiff(x2.grad(), ops::kernels::MulScalar(x2.detach(), 4.0)), 1e-15);
}

TEST(FunctionalGraph, BatchNormUpdatesBuffersAndUsesRankGenerator) {
  Tensor x = Randn({4, 2}, 16).set_requires_grad(true);
  Tensor rm = Tensor::zeros({2}, kF64), rv = Tensor::ones({2}, kF64);
  Tensor nbt = Tensor::from_int64s({0}, {});
  batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.1, 1e-5, nbt);
  EXPECT_EQ(nbt.to_int64s()[0], 1);
  EXPECT_NE(rm.to_doubles()[0], 0.0);
  batch_norm(x, rm, rv, Tensor(), Tensor(), false, 0.1, 1e-5, nbt);
  EXPECT_EQ(nbt.to_int64s()[0], 1);
  // dropout draws from the current rank's generator unless one is given.
  RankContext ctx(0, 1, Device::CPU(), 123);
  RankContextGuard guard(ctx);
  const Tensor ones = Tensor::ones({16}, kF64);
  const Tensor a = dropout(ones, 0.5);
  ctx.generator().manual_seed(123);
  const Tensor b = dropout(ones, 0.5);
  EXPECT_EQ(a.to_doubles(), b.to_doubles());
  EXPECT_EQ(ctx.generator().offset(), 4u);
}

}  // namespace
}  // namespace fsdp
