#include "reference/transformer_with_shared_params.h"

#include <gtest/gtest.h>

#include "reference/gradient_check.h"

namespace fsdp::reference {
namespace {

using Twsp = TransformerWithSharedParams<double>;

TransformerWithSharedParamsConfig Small(bool add_bn) {
  TransformerWithSharedParamsConfig c;
  c.add_bn = add_bn;
  c.vocab_size = 7;
  c.d_model = 4;
  c.nhead = 2;
  c.num_encoder_layers = 1;
  c.num_decoder_layers = 1;
  c.dim_feedforward = 3;
  return c;
}

RefTensorMap RandomBuffers(const Twsp& m, uint64_t seed) {
  RefTensorMap b = m.DefaultBuffers();
  b["vocab_bias"] = UniformTensor<double>(b["vocab_bias"].shape, seed, 0.5, 1.5);
  if (b.count("bn.running_mean")) {
    b["bn.running_mean"] = UniformTensor<double>({2}, seed + 1, -0.2, 0.2);
    b["bn.running_var"] = UniformTensor<double>({2}, seed + 2, 0.5, 1.5);
  }
  return b;
}

TEST(TransformerWithSharedParamsTest, ParameterAndBufferOrder) {
  const Twsp m;
  const std::vector<TensorSpec> specs = m.ParameterSpecs();
  ASSERT_EQ(specs.size(), 1u + 2 * 12 + 2 + 2 * 18 + 2 + 1 + 2);
  EXPECT_EQ(specs[0], (TensorSpec{"embed_tokens.weight", {23, 16}}));
  EXPECT_EQ(specs[1],
            (TensorSpec{"transformer.encoder.layers.0.self_attn.in_proj_weight", {48, 16}}));
  EXPECT_EQ(specs[2], (TensorSpec{"transformer.encoder.layers.0.self_attn.in_proj_bias", {48}}));
  EXPECT_EQ(specs[3].name, "transformer.encoder.layers.0.self_attn.out_proj.weight");
  EXPECT_EQ(specs[5], (TensorSpec{"transformer.encoder.layers.0.linear1.weight", {8, 16}}));
  EXPECT_EQ(specs[7], (TensorSpec{"transformer.encoder.layers.0.linear2.weight", {16, 8}}));
  EXPECT_EQ(specs[9].name, "transformer.encoder.layers.0.norm1.weight");
  EXPECT_EQ(specs[25].name, "transformer.encoder.norm.weight");
  EXPECT_EQ(specs[27].name, "transformer.decoder.layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(specs[31].name, "transformer.decoder.layers.0.multihead_attn.in_proj_weight");
  EXPECT_EQ(specs[44].name, "transformer.decoder.layers.0.norm3.bias");
  EXPECT_EQ(specs[63].name, "transformer.decoder.norm.weight");
  EXPECT_EQ(specs[65], (TensorSpec{"output_proj.bias", {23}}));  // weight tied to embed_tokens
  EXPECT_EQ(specs[66], (TensorSpec{"bn.weight", {2}}));
  EXPECT_EQ(specs[67], (TensorSpec{"bn.bias", {2}}));
  std::vector<std::string> buffers;
  for (const TensorSpec& s : m.BufferSpecs()) buffers.push_back(s.name);
  EXPECT_EQ(buffers, (std::vector<std::string>{"vocab_bias", "long_buffer", "bn.running_mean",
                                               "bn.running_var", "bn.num_batches_tracked"}));
  TransformerWithSharedParamsConfig no_bn;
  no_bn.add_bn = false;
  EXPECT_EQ(Twsp(no_bn).ParameterSpecs().back().name, "output_proj.bias");
  EXPECT_EQ(Twsp(no_bn).BufferSpecs().size(), 2u);
}

TEST(TransformerWithSharedParamsTest, GradientsMatchFiniteDifferencesSmall) {
  for (bool add_bn : {true, false}) {
    const Twsp m(Small(add_bn));
    const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 1, -0.5, 0.5);
    ModelInput<double> in;
    in.tokens = UniformIndices({3, 2}, 2, 7);
    in.decoder_tokens = UniformIndices({2, 2}, 3, 7);
    const GradientCheckResult r = CheckModelGradients(m, p, RandomBuffers(m, 4), in, 5, 1e-6, 1e-8);
    EXPECT_TRUE(r.ok) << "add_bn " << add_bn << ": " << r.message;
  }
}

TEST(TransformerWithSharedParamsTest, DefaultModelSumCrossEntropyMatchesFiniteDifferences) {
  const Twsp m;
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 6, -0.3, 0.3);
  const RefTensorMap buffers = RandomBuffers(m, 7);
  const ModelInput<double> in = Twsp::GetInput();
  const LossSpec loss = CrossEntropyLoss(Reduction::kSum);
  const LossAndGrads<double> lg = ForwardBackward(m, p, buffers, in, loss);
  EXPECT_EQ(lg.outputs[0].shape, (Shape{4, 2, 23}));
  EXPECT_EQ(lg.grads.size(), m.ParameterSpecs().size());
  FiniteDifferenceOptions fd;
  fd.max_entries_per_tensor = 4;
  const RefTensorMap numerical = NumericalGradients(
      [&](const RefTensorMap& q) { return EvaluateLoss(m, q, buffers, in, loss); }, p, fd);
  const GradientCheckResult r = CompareToNumerical(lg.grads, numerical, 1e-6, 1e-8);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(TransformerWithSharedParamsTest, GetInputAndBuffersEnterTheForward) {
  const ModelInput<double> in = Twsp::GetInput();
  EXPECT_EQ(in.tokens->shape, (Shape{6, 2}));
  EXPECT_EQ(in.tokens->data[11], 11);
  EXPECT_EQ(in.decoder_tokens->shape, (Shape{4, 2}));
  EXPECT_EQ(*in.targets, *in.decoder_tokens);
  const Twsp m;
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 8, -0.3, 0.3);
  const RefTensorMap b = m.DefaultBuffers();
  EXPECT_EQ(b.at("vocab_bias"), Full<double>({16}, 1));
  EXPECT_EQ(b.at("bn.running_var"), Full<double>({2}, 1));
  RefTensorMap b2 = b;
  b2["vocab_bias"][0] = 2;
  EXPECT_GT(MaxAbsDiff(m.Forward(p, b, in).outputs[0], m.Forward(p, b2, in).outputs[0]), 0.0);
  ModelInput<double> bad = in;
  bad.tokens = IndexTensor({4, 3}, std::vector<int64_t>(12, 0));
  EXPECT_THROW(m.Forward(p, b, bad), std::invalid_argument);
}

}  // namespace
}  // namespace fsdp::reference
