#include "reference/models.h"

#include <gtest/gtest.h>

#include <limits>

#include "reference/gradient_check.h"

namespace fsdp::reference {
namespace {

std::vector<std::string> Names(const std::vector<TensorSpec>& specs) {
  std::vector<std::string> names;
  for (const TensorSpec& s : specs) names.push_back(s.name);
  return names;
}

ModelInput<double> Features(const Shape& shape, uint64_t seed) {
  ModelInput<double> in;
  in.features = UniformTensor<double>(shape, seed, -1, 1);
  return in;
}

// FD check of every parameter and the input, with tolerances for double central differences.
void ExpectModelGradientsMatch(const Model<double>& model, const RefTensorMap& params,
                               const RefTensorMap& buffers, const ModelInput<double>& input,
                               const std::vector<bool>& use_output = {}) {
  const GradientCheckResult r = CheckModelGradients(model, params, buffers, input, /*seed=*/99,
                                                    /*rtol=*/1e-6, /*atol=*/1e-8, {}, use_output);
  EXPECT_TRUE(r.ok) << model.Name() << ": " << r.message;
  EXPECT_GT(r.checked_entries, 0);
}

RefTensorMap Params(const Model<double>& m, uint64_t seed) {
  return UniformTensors<double>(m.ParameterSpecs(), seed, -0.5, 0.5);
}

// ---- FQNs and shapes in registration order ----------------------------------------------------

TEST(ModelSpecsTest, MlpModuleAndStacked) {
  const MlpModule<double> m;
  EXPECT_EQ(m.ParameterSpecs(), (std::vector<TensorSpec>{{"net1.weight", {16, 10}},
                                                         {"net1.bias", {16}},
                                                         {"net2.weight", {10, 16}},
                                                         {"net2.bias", {10}}}));
  EXPECT_EQ(Names(MlpModule<double>(MlpModuleConfig{false}).ParameterSpecs()),
            (std::vector<std::string>{"net1.weight", "net2.weight"}));
  EXPECT_EQ(Names(MlpStacked<double>().ParameterSpecs()),
            (std::vector<std::string>{"layers.0.net1.weight", "layers.0.net1.bias",
                                      "layers.0.net2.weight", "layers.0.net2.bias",
                                      "layers.1.net1.weight", "layers.1.net1.bias",
                                      "layers.1.net2.weight", "layers.1.net2.bias"}));
}

TEST(ModelSpecsTest, TpSimpleModelAndNestedWrappedModule) {
  EXPECT_EQ(TpSimpleModel<double>().ParameterSpecs(),
            (std::vector<TensorSpec>{{"net1.weight", {8, 5}},
                                     {"net1.bias", {8}},
                                     {"net2.weight", {4, 8}},
                                     {"net2.bias", {4}},
                                     {"net3.weight", {12, 4}},
                                     {"net3.bias", {12}}}));
  EXPECT_EQ(Names(NestedWrappedModule<double>().ParameterSpecs()),
            (std::vector<std::string>{"module.0.weight", "module.0.bias", "module.1.0.weight",
                                      "module.1.0.bias", "module.1.1.weight", "module.1.1.bias",
                                      "module.2.weight", "module.2.bias", "module.3.weight",
                                      "module.3.bias"}));
}

TEST(ModelSpecsTest, MlpAndMlpStack) {
  MlpConfig c;
  c.dim = 4;
  c.with_buffer = true;
  const Mlp<double> mlp(c);
  EXPECT_EQ(mlp.ParameterSpecs(), (std::vector<TensorSpec>{{"in_proj.weight", {16, 4}},
                                                           {"in_proj.bias", {16}},
                                                           {"out_proj.weight", {4, 16}},
                                                           {"out_proj.bias", {4}}}));
  EXPECT_EQ(mlp.BufferSpecs(), (std::vector<TensorSpec>{{"buffer", {4}}}));

  const MlpStack<double> stack(MlpStackConfig{5, false});
  const std::vector<TensorSpec> specs = stack.ParameterSpecs();
  ASSERT_EQ(specs.size(), 12u);
  EXPECT_EQ(specs[0], (TensorSpec{"0.in_proj.weight", {15, 5}}));  // multiplier 3: uneven rows
  EXPECT_EQ(specs[2], (TensorSpec{"0.out_proj.weight", {5, 15}}));
  EXPECT_EQ(specs[4], (TensorSpec{"1.in_proj.weight", {20, 5}}));
  EXPECT_EQ(specs[11], (TensorSpec{"2.out_proj.bias", {5}}));
  const MlpStack<double> sp(MlpStackConfig{5, true});
  EXPECT_EQ(sp.ParameterSpecs().back(), (TensorSpec{"3.weight", {5}}));  // LayerNorm, bias=False
  EXPECT_EQ(sp.ParameterSpecs().size(), 13u);
}

TEST(ModelSpecsTest, DoubleLinearAndStateDictModels) {
  EXPECT_EQ(Names(DoubleLinear<double>(DoubleLinearConfig{3, false, false}).ParameterSpecs()),
            (std::vector<std::string>{"lin1.weight", "lin1.bias", "lin2.weight", "lin2.bias"}));
  EXPECT_EQ(Names(DoubleLinear<double>(DoubleLinearConfig{3, true, true}).ParameterSpecs()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.lin1.weight", "1.lin1.bias",
                                      "1.lin2.weight", "1.lin2.bias"}));
  EXPECT_EQ(StateDictModel<double>().ParameterSpecs(),
            (std::vector<TensorSpec>{{"inner.weight", {4, 4}},
                                     {"inner.bias", {4}},
                                     {"outer.weight", {5, 4}},
                                     {"outer.bias", {5}}}));
  const StateDictModel<double> with_buffers(StateDictModelConfig{true});
  ASSERT_EQ(with_buffers.BufferSpecs().size(), 4u);
  EXPECT_EQ(with_buffers.BufferSpecs()[1].name, "inner.non_persistent_buffer");
  EXPECT_FALSE(with_buffers.BufferSpecs()[1].persistent);
  EXPECT_EQ(Names(SharedSubmoduleModel<double>().ParameterSpecs()),
            (std::vector<std::string>{"net1.0.weight", "net1.0.bias", "net2.0.weight",
                                      "net2.0.bias", "random_parameter"}));
  EXPECT_EQ(Names(MlpWithRmsNorm<double>().ParameterSpecs()),
            (std::vector<std::string>{"mlp.net1.weight", "mlp.net1.bias", "mlp.net2.weight",
                                      "mlp.net2.bias", "mlp_norm.weight"}));
  const LinearBatchNormLinear<double> bn;
  EXPECT_EQ(Names(bn.ParameterSpecs()),
            (std::vector<std::string>{"0.weight", "1.weight", "1.bias", "2.weight"}));
  EXPECT_EQ(Names(bn.BufferSpecs()),
            (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"}));
}

// ---- Forward values by hand --------------------------------------------------------------------

TEST(StateDictModelTest, ForwardRunsInnerTwice) {
  const StateDictModel<double> m;
  RefTensorMap p = ZerosLike<double>(m.ParameterSpecs());
  // inner = identity + bias 1, outer = sum of inputs into every output.
  for (int i = 0; i < 4; ++i) p["inner.weight"][i * 4 + i] = 1;
  p["inner.bias"] = Full<double>({4}, 1);
  p["outer.weight"] = Full<double>({5, 4}, 1);
  ModelInput<double> in;
  in.features = RefTensor({1, 4}, {1, 2, 3, 4});
  const ForwardResult<double> f = m.Forward(p, {}, in);
  // inner(x) + inner(x) = 2 * (x + 1) = [4, 6, 8, 10]; outer sums to 28.
  EXPECT_EQ(f.outputs[0], Full<double>({1, 5}, 28));
}

TEST(MlpTest, BufferIsAddedAfterTheLastRelu) {
  MlpConfig c;
  c.dim = 2;
  c.dim_multiplier = 1;
  c.with_buffer = true;
  const Mlp<double> m(c);
  RefTensorMap p = ZerosLike<double>(m.ParameterSpecs());
  p["out_proj.bias"] = RefTensor({2}, {-1, 2});  // relu(-1) = 0, relu(2) = 2
  ModelInput<double> in;
  in.features = RefTensor({1, 2}, {5, 5});
  const RefTensorMap buffers = {{"buffer", RefTensor({2}, {10, 20})}};
  EXPECT_EQ(m.Forward(p, buffers, in).outputs[0], RefTensor({1, 2}, {10, 22}));
}

// ---- Gradients against finite differences -----------------------------------------------------

TEST(ModelGradientTest, LinearChains) {
  ExpectModelGradientsMatch(MlpModule<double>(), Params(MlpModule<double>(), 1), {},
                            Features({3, 10}, 2));
  ExpectModelGradientsMatch(MlpModule<double>(MlpModuleConfig{false}),
                            Params(MlpModule<double>(MlpModuleConfig{false}), 3), {},
                            Features({3, 10}, 4));
  ExpectModelGradientsMatch(MlpStacked<double>(), Params(MlpStacked<double>(), 5), {},
                            Features({2, 10}, 6));
  ExpectModelGradientsMatch(TpSimpleModel<double>(), Params(TpSimpleModel<double>(), 7), {},
                            Features({4, 5}, 8));
  ExpectModelGradientsMatch(NestedWrappedModule<double>(), Params(NestedWrappedModule<double>(), 9),
                            {}, Features({4, 8}, 10));
}

TEST(ModelGradientTest, MlpWithBufferAndThreeDimInput) {
  MlpConfig c;
  c.dim = 4;
  c.with_buffer = true;
  const Mlp<double> m(c);
  const RefTensorMap buffers = {{"buffer", UniformTensor<double>({4}, 11, -1, 1)}};
  ExpectModelGradientsMatch(m, Params(m, 12), buffers, Features({2, 3, 4}, 13));
}

TEST(ModelGradientTest, MlpStackWithAndWithoutSequenceParallelNorm) {
  for (bool sp : {false, true}) {
    const MlpStack<double> m(MlpStackConfig{4, sp});
    ExpectModelGradientsMatch(m, Params(m, 14), {}, Features({3, 4}, 15));
  }
}

TEST(ModelGradientTest, DoubleLinearVariants) {
  for (bool second : {true, false}) {
    for (bool preceded : {false, true}) {
      const DoubleLinear<double> m(DoubleLinearConfig{5, second, preceded});
      ExpectModelGradientsMatch(m, Params(m, 16), {}, Features({3, 5}, 17));
    }
  }
}

TEST(ModelGradientTest, OtherSeedModels) {
  ExpectModelGradientsMatch(MlpWithRmsNorm<double>(), Params(MlpWithRmsNorm<double>(), 18), {},
                            Features({3, 10}, 19));
  MlpWithRmsNormConfig norm_last;
  norm_last.norm_last = true;  // the norm's input gradient flows into the MLP
  ExpectModelGradientsMatch(MlpWithRmsNorm<double>(norm_last),
                            Params(MlpWithRmsNorm<double>(norm_last), 18), {},
                            Features({3, 10}, 19));
  ExpectModelGradientsMatch(StateDictModel<double>(), Params(StateDictModel<double>(), 20), {},
                            Features({3, 4}, 21));
  ExpectModelGradientsMatch(SharedSubmoduleModel<double>(),
                            Params(SharedSubmoduleModel<double>(), 22), {}, Features({3, 8}, 23));
}

TEST(ModelGradientTest, GatedNorms) {
  // Training-mode BatchNorm, a subtracted parameter, nn.RMSNorm, softmax and a [1, 1] scale.
  const GatedNorms<double> m;
  RefTensorMap buffers = m.DefaultBuffers();
  buffers["bn.running_mean"] = UniformTensor<double>({8}, 28, -0.3, 0.3);
  buffers["bn.running_var"] = UniformTensor<double>({8}, 29, 0.5, 1.5);
  ExpectModelGradientsMatch(m, Params(m, 30), buffers, Features({5, 8}, 31));
  // The running statistics: momentum 0.1 toward the batch mean and the unbiased batch variance.
  const ForwardResult<double> f = m.Forward(Params(m, 30), buffers, Features({5, 8}, 31));
  EXPECT_EQ(f.buffers.at("bn.num_batches_tracked")[0], 1.0);
}

TEST(ModelGradientTest, OpMix) {
  // Division by exp, slices, sqrt, cat, log, a sum over a dim and the mean of every element.
  const OpMix<double> m;
  ExpectModelGradientsMatch(m, Params(m, 32), {}, Features({5, 6}, 33));
}

TEST(ModelGradientTest, OpProducts) {
  // split, reciprocal, rsub, bmm, mv, expand, clone, neg and dot.
  const OpProducts<double> m;
  ExpectModelGradientsMatch(m, Params(m, 34), {}, Features({5, 6}, 35));
}

TEST(ModelGradientTest, PaddedLm) {
  // Embedding(padding_idx), an attn_mask parameter with an explicit scale, cross_entropy with
  // ignore_index: vocab 3 makes the padding id (0) frequent among inputs and targets. The
  // padding row is looked up in forward, so the loss does depend on it, but autograd treats it
  // as a constant (no gradient): finite differences are compared everywhere else, and the
  // padding row's gradient must be exactly zero.
  PaddedLmConfig c;
  c.vocab_size = 3;
  const PaddedLm<double> m(c);
  ModelInput<double> in;
  in.tokens = UniformIndices({3, c.seq_len}, 37, c.vocab_size);
  int64_t pads = 0;
  for (int64_t id : in.tokens->data) pads += id == c.padding_idx;
  ASSERT_GT(pads, 1);
  const RefTensorMap p = Params(m, 36);
  const BackwardResult<double> g =
      m.Backward(p, {}, in, {BasicRefTensor<double>(Shape{1}, std::vector<double>{1.0})});
  RefTensorMap numerical = NumericalGradients(
      [&](const RefTensorMap& at) { return m.Forward(at, {}, in).outputs[0][0]; }, p);
  RefTensor& table = numerical.at("tok_embeddings.weight");
  for (int64_t j = 0; j < c.dim; ++j) {
    EXPECT_NE(table[c.padding_idx * c.dim + j], 0.0) << "the padding row is read in forward";
    table[c.padding_idx * c.dim + j] = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(g.grads.at("tok_embeddings.weight")[c.padding_idx * c.dim + j], 0.0);
  }
  const GradientCheckResult r = CompareToNumerical(g.grads, numerical, 1e-6, 1e-8);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(ModelGradientTest, LinearBatchNormLinearTrainingAndEval) {
  for (bool training : {true, false}) {
    LinearBatchNormLinearConfig c;
    c.dim = 4;
    c.training = training;
    const LinearBatchNormLinear<double> m(c);
    RefTensorMap buffers = m.DefaultBuffers();
    buffers["1.running_mean"] = UniformTensor<double>({4}, 24, -0.3, 0.3);
    buffers["1.running_var"] = UniformTensor<double>({4}, 25, 0.5, 1.5);
    ExpectModelGradientsMatch(m, Params(m, 26), buffers, Features({5, 4}, 27));
  }
}

// ---- Absent gradients --------------------------------------------------------------------------

TEST(DoubleLinearTest, UnusedOutputOrModuleGetsNoGradient) {
  const DoubleLinear<double> both(DoubleLinearConfig{4, true, false});
  const RefTensorMap p = Params(both, 30);
  const ModelInput<double> in = Features({2, 4}, 31);
  // (out1 * out2).sum(): both linears get gradients.
  const LossAndGrads<double> prod = ForwardBackward(both, p, {}, in, ProductSumLoss(0, 1));
  EXPECT_EQ(prod.grads.size(), 4u);
  // out1.sum(): lin2's output is unused, its parameters stay None.
  const LossAndGrads<double> first = ForwardBackward(both, p, {}, in, SumLoss({0}));
  EXPECT_EQ(first.grads.count("lin1.weight"), 1u);
  EXPECT_EQ(first.grads.count("lin2.weight"), 0u);
  EXPECT_EQ(first.grads.count("lin2.bias"), 0u);
  // use_second_linear=False: lin2 never runs.
  const DoubleLinear<double> one(DoubleLinearConfig{4, false, false});
  EXPECT_EQ(one.Forward(p, {}, in).outputs.size(), 1u);
  const LossAndGrads<double> only = ForwardBackward(one, p, {}, in, SumLoss());
  EXPECT_EQ(only.grads.size(), 2u);
  EXPECT_EQ(only.grads.count("lin2.weight"), 0u);
  EXPECT_EQ(only.grads.at("lin1.weight"), first.grads.at("lin1.weight"));
}

TEST(SharedSubmoduleModelTest, UnusedParameterAbsentAndSharedModuleAccumulates) {
  const SharedSubmoduleModel<double> m;
  const LossAndGrads<double> r =
      ForwardBackward(m, Params(m, 32), {}, Features({2, 8}, 33), SumLoss());
  EXPECT_EQ(r.grads.size(), 4u);
  EXPECT_EQ(r.grads.count("random_parameter"), 0u);
}

TEST(LinearBatchNormLinearTest, TrainingForwardUpdatesRunningStatistics) {
  const LinearBatchNormLinear<double> m;
  const RefTensorMap buffers = m.DefaultBuffers();
  EXPECT_EQ(buffers.at("1.running_var"), Full<double>({10}, 1));
  const ForwardResult<double> f = m.Forward(Params(m, 34), buffers, Features({6, 10}, 35));
  EXPECT_EQ(f.buffers.at("1.num_batches_tracked"), RefTensor(Shape{}, {1}));
  EXPECT_NE(f.buffers.at("1.running_mean"), buffers.at("1.running_mean"));
  LinearBatchNormLinearConfig eval;
  eval.training = false;
  const ForwardResult<double> fe =
      LinearBatchNormLinear<double>(eval).Forward(Params(m, 34), buffers, Features({6, 10}, 35));
  EXPECT_EQ(fe.buffers, buffers);
}

// ---- Input validation --------------------------------------------------------------------------

TEST(ModelValidationTest, RejectsMissingExtraAndMisshapedParameters) {
  const MlpModule<double> m;
  RefTensorMap p = Params(m, 36);
  const ModelInput<double> in = Features({2, 10}, 37);
  RefTensorMap missing = p;
  missing.erase("net2.bias");
  EXPECT_THROW(m.Forward(missing, {}, in), std::invalid_argument);
  RefTensorMap extra = p;
  extra["output.weight"] = RefTensor({1});
  EXPECT_THROW(m.Forward(extra, {}, in), std::invalid_argument);
  RefTensorMap wrong = p;
  wrong["net1.weight"] = RefTensor({10, 16});
  EXPECT_THROW(m.Forward(wrong, {}, in), std::invalid_argument);
  EXPECT_THROW(m.Forward(p, {}, Features({2, 9}, 38)), std::invalid_argument);
  LinearChainConfig bad;
  bad.stages = {{"a", 2, 3}, {"b", 4, 1}};
  EXPECT_THROW(LinearChain<double>{bad}, std::invalid_argument);
}

// ---- float instantiations ----------------------------------------------------------------------

TEST(FloatModelsTest, FloatForwardAndGradientsTrackDouble) {
  const MlpStack<double> md(MlpStackConfig{4, true});
  const MlpStack<float> mf(MlpStackConfig{4, true});
  const RefTensorMap p = Params(md, 40);
  const ModelInput<double> in = Features({3, 4}, 41);
  ModelInput<float> inf;
  inf.features = CastTensor<float>(*in.features);
  const LossAndGrads<double> d = ForwardBackward(md, p, {}, in, MeanLoss());
  const LossAndGrads<float> f = ForwardBackward(mf, CastMap<float>(p), {}, inf, MeanLoss());
  EXPECT_NEAR(f.loss, d.loss, 1e-6);
  std::string why;
  EXPECT_TRUE(AllCloseMaps(CastMap<double>(f.grads), d.grads, 1e-4, 1e-6, &why)) << why;
}

}  // namespace
}  // namespace fsdp::reference
