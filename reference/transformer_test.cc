#include "reference/transformer.h"

#include <gtest/gtest.h>

#include "reference/gradient_check.h"

namespace fsdp::reference {
namespace {

ModelArgs SmallArgs() {
  ModelArgs a;
  a.n_layers = 2;
  a.vocab_size = 5;
  a.max_seq_len = 6;
  a.dim = 8;
  a.n_heads = 2;
  return a;
}

ModelInput<double> Tokens(int64_t bsz, int64_t seq, int64_t vocab, uint64_t seed) {
  ModelInput<double> in;
  in.tokens = UniformIndices({bsz, seq}, seed, vocab);
  return in;
}

TEST(TransformerTest, DefaultParameterOrderAndShapes) {
  const Transformer<double> m;
  const std::vector<TensorSpec> specs = m.ParameterSpecs();
  const std::vector<TensorSpec> block0 = {{"layers.0.attention_norm.weight", {16}},
                                          {"layers.0.attention_norm.bias", {16}},
                                          {"layers.0.attention.wq.weight", {16, 16}},
                                          {"layers.0.attention.wk.weight", {16, 16}},
                                          {"layers.0.attention.wv.weight", {16, 16}},
                                          {"layers.0.attention.wo.weight", {16, 16}},
                                          {"layers.0.ffn_norm.weight", {16}},
                                          {"layers.0.ffn_norm.bias", {16}},
                                          {"layers.0.feed_forward.w1.weight", {64, 16}},
                                          {"layers.0.feed_forward.w1.bias", {64}},
                                          {"layers.0.feed_forward.w2.weight", {16, 64}},
                                          {"layers.0.feed_forward.w2.bias", {16}}};
  ASSERT_EQ(specs.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(specs[0], (TensorSpec{"tok_embeddings.weight", {8, 16}}));
  EXPECT_EQ(specs[1], (TensorSpec{"pos_embeddings.weight", {16, 16}}));
  EXPECT_EQ(std::vector<TensorSpec>(specs.begin() + 2, specs.begin() + 14), block0);
  EXPECT_EQ(specs[14].name, "layers.1.attention_norm.weight");
  EXPECT_EQ(specs[26], (TensorSpec{"norm.weight", {16}}));
  EXPECT_EQ(specs[27], (TensorSpec{"norm.bias", {16}}));  // output.weight is tied: not listed

  ModelArgs untied;
  untied.weight_tying = false;
  EXPECT_EQ(Transformer<double>(untied).ParameterSpecs().back(),
            (TensorSpec{"output.weight", {8, 16}}));
  ModelArgs bad;
  bad.n_heads = 3;
  EXPECT_THROW(Transformer<double>{bad}, std::invalid_argument);
}

TEST(TransformerTest, GradientsMatchFiniteDifferencesSmall) {
  for (bool tying : {true, false}) {
    for (bool causal : {true, false}) {
      ModelArgs a = SmallArgs();
      a.weight_tying = tying;
      a.use_attn_mask = causal;
      const Transformer<double> m(a);
      const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 1, -0.5, 0.5);
      // Every entry for the default variant (tied, causal); a sample of each tensor otherwise.
      FiniteDifferenceOptions fd;
      if (!(tying && causal)) fd.max_entries_per_tensor = 6;
      const GradientCheckResult r =
          CheckModelGradients(m, p, {}, Tokens(2, 4, a.vocab_size, 2), 3, 1e-6, 1e-8, fd);
      EXPECT_TRUE(r.ok) << "tying " << tying << " causal " << causal << ": " << r.message;
    }
  }
}

TEST(TransformerTest, GradientsMatchFiniteDifferencesDefaultArgsSampled) {
  const Transformer<double> m;
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 4, -0.3, 0.3);
  FiniteDifferenceOptions fd;
  fd.max_entries_per_tensor = 5;
  const GradientCheckResult r =
      CheckModelGradients(m, p, {}, Tokens(2, 16, 8, 5), 6, 1e-6, 1e-7, fd);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_GT(r.checked_entries, 100);
}

TEST(TransformerTest, CrossEntropyLossGradientsMatchFiniteDifferences) {
  const ModelArgs a = SmallArgs();
  const Transformer<double> m(a);
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 7, -0.5, 0.5);
  ModelInput<double> in = Tokens(2, 5, a.vocab_size, 8);
  in.targets = UniformIndices({2, 5}, 9, a.vocab_size);
  const LossSpec loss = CrossEntropyLoss(Reduction::kMean);
  const LossAndGrads<double> lg = ForwardBackward(m, p, {}, in, loss);
  FiniteDifferenceOptions fd;
  fd.max_entries_per_tensor = 10;
  const RefTensorMap numerical = NumericalGradients(
      [&](const RefTensorMap& q) { return EvaluateLoss(m, q, {}, in, loss); }, p, fd);
  const GradientCheckResult r = CompareToNumerical(lg.grads, numerical, 1e-6, 1e-9);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_FALSE(lg.input_grad.has_value());  // integer inputs have no gradient
}

TEST(TransformerTest, TiedGradientIsSumOfEmbeddingAndOutputUses) {
  // An untied model whose output.weight equals tok_embeddings.weight computes the same function;
  // the tied gradient must be the sum of the two untied gradients.
  ModelArgs tied = SmallArgs();
  ModelArgs untied = tied;
  untied.weight_tying = false;
  const Transformer<double> mt(tied), mu(untied);
  const RefTensorMap pt = UniformTensors<double>(mt.ParameterSpecs(), 10, -0.5, 0.5);
  RefTensorMap pu = pt;
  pu["output.weight"] = pt.at("tok_embeddings.weight");
  const ModelInput<double> in = Tokens(2, 6, tied.vocab_size, 11);
  const LossAndGrads<double> gt = ForwardBackward(mt, pt, {}, in, SumLoss());
  const LossAndGrads<double> gu = ForwardBackward(mu, pu, {}, in, SumLoss());
  EXPECT_NEAR(gt.loss, gu.loss, 1e-12);
  EXPECT_EQ(gt.grads.count("output.weight"), 0u);
  RefTensor sum = gu.grads.at("tok_embeddings.weight");
  for (int64_t i = 0; i < sum.numel(); ++i) sum[i] += gu.grads.at("output.weight")[i];
  EXPECT_LT(MaxAbsDiff(sum, gt.grads.at("tok_embeddings.weight")), 1e-12);
}

TEST(TransformerTest, CausalMaskHidesLaterTokens) {
  const ModelArgs a = SmallArgs();
  const Transformer<double> m(a);
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 12, -0.5, 0.5);
  ModelInput<double> in = Tokens(1, 4, a.vocab_size, 13);
  const RefTensor before = m.Forward(p, {}, in).outputs[0];
  in.tokens->data[3] = (in.tokens->data[3] + 1) % a.vocab_size;
  const RefTensor after = m.Forward(p, {}, in).outputs[0];
  ASSERT_EQ(before.shape, (Shape{1, 4, 5}));
  for (int64_t i = 0; i < 3 * 5; ++i) EXPECT_EQ(before[i], after[i]) << i;  // positions 0..2
  EXPECT_GT(MaxAbsDiff(before, after), 0.0);
}

TEST(TransformerTest, RejectsBadInputs) {
  const ModelArgs a = SmallArgs();
  const Transformer<double> m(a);
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 14, -0.5, 0.5);
  EXPECT_THROW(m.Forward(p, {}, Tokens(1, 7, a.vocab_size, 15)), std::invalid_argument);
  ModelInput<double> out_of_vocab = Tokens(1, 2, a.vocab_size, 16);
  out_of_vocab.tokens->data[0] = a.vocab_size;
  EXPECT_THROW(m.Forward(p, {}, out_of_vocab), std::invalid_argument);
  EXPECT_THROW(m.Forward(p, {}, ModelInput<double>{}), std::invalid_argument);
}

TEST(TransformerTest, FloatTracksDouble) {
  const Transformer<double> md;
  const Transformer<float> mf;
  const RefTensorMap p = UniformTensors<double>(md.ParameterSpecs(), 17, -0.3, 0.3);
  const ModelInput<double> in = Tokens(2, 16, 8, 18);
  ModelInput<float> inf;
  inf.tokens = in.tokens;
  const LossAndGrads<double> d = ForwardBackward(md, p, {}, in, SumLoss());
  const LossAndGrads<float> f = ForwardBackward(mf, CastMap<float>(p), {}, inf, SumLoss());
  EXPECT_NEAR(f.loss, d.loss, 1e-4 * std::max(1.0, std::abs(d.loss)));
  std::string why;
  EXPECT_TRUE(AllCloseMaps(CastMap<double>(f.grads), d.grads, 1e-3, 1e-4, &why)) << why;
}

}  // namespace
}  // namespace fsdp::reference
