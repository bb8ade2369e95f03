#include "conformance/model_zoo.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "conformance/observations.h"
#include "conformance/parity_common.h"
#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

CaseParams Defaults(const std::string& kind) {
  CaseParams p;
  for (const ParamSpec& spec : ZooModel::Kind(kind).params) p.set(spec.name, spec.default_value());
  return p;
}

TEST(ModelZoo, EngineAndOracleAgreeOnFqnsAndShapes) {
  for (const ZooModelKind& kind : ZooModel::Kinds()) {
    SCOPED_TRACE(kind.name);
    const ZooModel model = ZooModel::Make(kind.name, Defaults(kind.name));
    nn::ModulePtr module = model.BuildEngine();
    const auto named = module->named_parameters();
    const auto specs = model.oracle().ParameterSpecs();
    ASSERT_EQ(named.size(), specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(named[i].first, specs[i].name);
      EXPECT_EQ(named[i].second.sizes(), specs[i].shape) << specs[i].name;
    }
  }
}

// RoundTo's half and bfloat16 rule: round-to-nearest-even with ties to even, subnormals and
// overflow, and agreeing with a correct conversion on every sampled float.
TEST(ModelZoo, RoundToHalfAndBFloat16IsRoundToNearestEven) {
  // bfloat16 keeps 8 significand bits: 1 + 2^-8 is a tie (to 1), 1 + 3 * 2^-8 one (to 1 + 2^-6).
  EXPECT_EQ(RoundTo({1 + std::ldexp(1.0, -8)}, DType::kBFloat16)[0], 1.0);
  EXPECT_EQ(RoundTo({1 + 3 * std::ldexp(1.0, -8)}, DType::kBFloat16)[0], 1 + std::ldexp(1.0, -6));
  EXPECT_EQ(RoundTo({-(1 + 1.5 * std::ldexp(1.0, -8))}, DType::kBFloat16)[0],
            -(1 + std::ldexp(1.0, -7)));
  // float16: 11 bits, subnormal spacing 2^-24, largest finite 65504.
  EXPECT_EQ(RoundTo({1 + std::ldexp(1.0, -11)}, DType::kFloat16)[0], 1.0);
  EXPECT_EQ(RoundTo({3 * std::ldexp(1.0, -25)}, DType::kFloat16)[0], std::ldexp(1.0, -23));
  EXPECT_EQ(RoundTo({65519.0}, DType::kFloat16)[0], 65504.0);
  EXPECT_TRUE(std::isinf(RoundTo({65520.0}, DType::kFloat16)[0]));
  uint64_t state = 12345;
  for (int i = 0; i < 20000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float f = std::ldexp(static_cast<float>(state >> 40) / 16777216.0f - 0.5f,
                               static_cast<int>((state >> 8) % 40) - 20);
    EXPECT_EQ(RoundTo({f}, DType::kBFloat16)[0], static_cast<float>(BFloat16(f))) << f;
    EXPECT_EQ(RoundTo({f}, DType::kFloat16)[0], static_cast<float>(Half(f))) << f;
  }
}

TEST(ModelZoo, WeightsAreDeterministicAndRoundedToTheDtype) {
  const ZooModel model = ZooModel::Make("mlp", Defaults("mlp"));
  const reference::RefTensorMap a = model.MakeParameters(7, DType::kFloat32);
  EXPECT_EQ(a, model.MakeParameters(7, DType::kFloat32));
  EXPECT_NE(a, model.MakeParameters(8, DType::kFloat32));
  const reference::RefTensorMap exact = model.MakeParameters(7, DType::kFloat64);
  for (const auto& [name, t] : a) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      EXPECT_EQ(t[i], static_cast<double>(static_cast<float>(exact.at(name)[i])));
    }
  }
  // Linear weights lie in +-1/sqrt(in); biases in +-0.1.
  const double bound = 1.0 / std::sqrt(8.0);
  for (double v : exact.at("in_proj.weight").data) EXPECT_LE(std::fabs(v), bound);
  for (double v : exact.at("in_proj.bias").data) EXPECT_LE(std::fabs(v), 0.1);
}

TEST(ModelZoo, InputsDependOnTheStepAndSliceByRank) {
  const ZooModel model = ZooModel::Make("tp_simple_model", Defaults("tp_simple_model"));
  const ZooInput x0 = model.MakeInput(0, 0, DType::kFloat32);
  const ZooInput x1 = model.MakeInput(0, 1, DType::kFloat32);
  ASSERT_TRUE(x0.oracle.features.has_value());
  EXPECT_EQ(x0.oracle.features->shape, (reference::Shape{2, 3, 5}));
  EXPECT_NE(x0.oracle.features->data, x1.oracle.features->data);
  const ZooInput global = model.MakeInput(0, 0, DType::kFloat32, 4);
  const ZooInput r1 = global.RankSlice(1, 2);
  EXPECT_EQ(r1.rows(), 2);
  EXPECT_EQ(r1.oracle.features->data[0], global.oracle.features->data[30]);
  const Tensor t = r1.ToEngine();
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.to_doubles(), r1.oracle.features->data);

  const ZooModel tf = ZooModel::Make("transformer", Defaults("transformer"));
  const ZooInput tokens = tf.MakeInput(3, 0, DType::kFloat32);
  ASSERT_TRUE(tokens.oracle.tokens.has_value());
  EXPECT_EQ(tokens.oracle.tokens->shape, (reference::Shape{2, 16}));
  for (int64_t id : tokens.oracle.tokens->data) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 8);
  }
  EXPECT_EQ(tokens.ToEngine().dtype(), DType::kInt64);
}

TEST(ModelZoo, LoadWeightsGivesTheEngineTheSameBytes) {
  for (const ZooModelKind& kind : ZooModel::Kinds()) {
    SCOPED_TRACE(kind.name);
    const ZooModel model = ZooModel::Make(kind.name, Defaults(kind.name));
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      nn::ModulePtr module = model.BuildEngineWithWeights(11, dtype);
      EXPECT_EQ(ParametersOf(*module), model.MakeParameters(11, dtype));
      for (const auto& [name, p] : module->named_parameters()) EXPECT_EQ(p.dtype(), dtype);
    }
  }
}

TEST(ModelZoo, TiedOutputWeightLoadsFromTheEmbedding) {
  const ZooModel model = ZooModel::Make("transformer", Defaults("transformer"));
  nn::ModulePtr module = model.BuildEngine();
  const reference::RefTensorMap params = model.MakeParameters(1, DType::kFloat32);
  const nn::StateDict sd = MakeStateDict(*module, params, {}, DType::kFloat32);
  ASSERT_TRUE(sd.contains("output.weight"));
  EXPECT_EQ(sd.at("output.weight").to_doubles(), params.at("tok_embeddings.weight").data);
  reference::RefTensorMap missing = params;
  missing.erase("norm.bias");
  try {
    MakeStateDict(*module, missing, {}, DType::kFloat32);
    FAIL() << "expected NotFound";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("norm.bias"));
  }
}

TEST(ModelZoo, ForwardAndBackwardMatchTheOracleInFloat64) {
  for (const ZooModelKind& kind : ZooModel::Kinds()) {
    SCOPED_TRACE(kind.name);
    const ZooModel model = ZooModel::Make(kind.name, Defaults(kind.name));
    nn::ModulePtr module = model.BuildEngineWithWeights(2, DType::kFloat64);
    const ZooInput input = model.MakeInput(2, 0, DType::kFloat64);
    Tensor loss = ZooModel::Loss(model.Forward(*module, input.ToEngine()), model.LossAt(0));
    loss.backward();
    const auto expected = reference::ForwardBackward(
        model.oracle(), model.MakeParameters(2, DType::kFloat64),
        model.MakeBuffers(2, DType::kFloat64), input.oracle, model.LossAt(0));
    // The Transformer's logits are cast to float32 at the end of its forward.
    EXPECT_NEAR(loss.item(), expected.loss, 1e-5 * (1 + std::fabs(expected.loss)));
    std::string why;
    EXPECT_TRUE(reference::AllCloseMaps(GradientsOf(*module), expected.grads, 1e-9, 1e-10, &why))
        << why;
  }
}

TEST(ModelZoo, DoubleLinearLossSwitchesToTheFirstOutput) {
  CaseParams p = Defaults("double_linear");
  const ZooModel two = ZooModel::Make("double_linear", p);
  EXPECT_EQ(two.num_outputs(), 2);
  EXPECT_EQ(two.LossAt(2).kind, reference::LossKind::kSumOfProduct);
  EXPECT_EQ(two.LossAt(3).kind, reference::LossKind::kSum);
  EXPECT_THAT(two.LossAt(3).outputs, ElementsAre(0));
  p.set("use_second_linear", "False");
  const ZooModel one = ZooModel::Make("double_linear", p);
  EXPECT_EQ(one.num_outputs(), 1);
  EXPECT_EQ(one.LossAt(0).kind, reference::LossKind::kSum);
  // lin2 is unused: its gradients stay None.
  nn::ModulePtr module = one.BuildEngineWithWeights(0, DType::kFloat32);
  Tensor loss = ZooModel::Loss(
      one.Forward(*module, one.MakeInput(0, 0, DType::kFloat32).ToEngine()), one.LossAt(0));
  loss.backward();
  EXPECT_THAT(ParametersWithoutGrad(*module), ElementsAre("lin2.weight", "lin2.bias"));
}

TEST(ModelZoo, SingleRankTrainingMatchesTheOracle) {
  const ZooModel model = ZooModel::Make("mlp_module", Defaults("mlp_module"));
  for (const char* kind : {"sgd", "adam"}) {
    SCOPED_TRACE(kind);
    OptimConfig optim;
    optim.kind = kind;
    // Through the runner-owned inputs: the same bytes a driver reads from its files.
    const auto inputs = model.MakeCaseInputs(5, DType::kFloat64, 4, /*world=*/1).ForRank(0);
    nn::ModulePtr module = model.BuildEngineFromInputs(*inputs, DType::kFloat64);
    const EngineTrainingRecord engine = TrainEngine(model, *module, optim, *inputs, 4);
    const auto oracle = TrainOracle(model, optim, 5, 4, DType::kFloat64);
    ASSERT_EQ(engine.losses.size(), 4u);
    ASSERT_EQ(oracle.size(), 4u);
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_NEAR(engine.losses[k], oracle[k].rank_losses[0], 1e-10);
      std::string why;
      EXPECT_TRUE(
          reference::AllCloseMaps(engine.parameters[k], oracle[k].params, 1e-10, 1e-12, &why))
          << why;
    }
  }
}

TEST(ModelZoo, CaseInputsHoldEveryStateDictKeyAndEachRanksSlice) {
  const ZooModel model = ZooModel::Make("transformer", Defaults("transformer"));
  const int world = 3;
  const CaseInputs inputs = model.MakeCaseInputs(7, DType::kFloat32, 2, world);
  nn::ModulePtr module = model.BuildEngine();
  std::vector<std::string> keys;
  for (const auto& [key, t] : inputs.weights) keys.push_back(key);
  std::vector<std::string> expected_keys;
  for (const auto& [key, t] : module->state_dict()) expected_keys.push_back(key);
  EXPECT_EQ(keys, expected_keys);  // tied output.weight included, under its own key
  ASSERT_EQ(inputs.ranks.size(), static_cast<size_t>(world));
  for (int64_t step = 0; step < 2; ++step) {
    const ZooInput global = model.MakeInput(7, step, DType::kFloat32, world * model.batch());
    for (int r = 0; r < world; ++r) {
      const auto rank_inputs = inputs.ForRank(r);
      const Tensor& mine = rank_inputs->Get(StepInputName(step));
      EXPECT_EQ(mine.to_int64s(), global.RankSlice(r, world).ToEngine().to_int64s());
    }
  }
  EXPECT_THROW(inputs.ForRank(0)->Get("step2/input"), Error);
}

TEST(ModelZoo, MapsRoundTripThroughObservations) {
  reference::RefTensorMap m;
  m["a.weight"] = reference::RefTensor({2, 2}, {1, 2, 3, 4});
  m["b"] = reference::RefTensor({1}, {5});
  nlohmann::json obs;
  obs[kTensors] = MapToJson(m, "float32", "grad/");
  obs[kTensors]["other"] = TensorJson({1}, "float32", {9});
  const std::vector<nlohmann::json> per_rank = {obs};
  EXPECT_EQ(MapFromObservations(per_rank, 0, "grad/"), m);
}

TEST(ModelZoo, CheckMapsCloseNamesTheMismatchingFqn) {
  reference::RefTensorMap e, a;
  e["x"] = reference::RefTensor({2}, {1, 2});
  e["y"] = reference::RefTensor({1}, {3});
  a = e;
  CheckList ok;
  const ErrorStats none = CheckMapsClose(ok, "params", e, a, {1e-6, 1e-6});
  EXPECT_TRUE(ok.all_passed());
  EXPECT_EQ(ok.checks().size(), 1u);
  EXPECT_EQ(none.max_abs, 0);
  a["y"] = reference::RefTensor({1}, {3.5});
  a["z"] = reference::RefTensor({1}, {0});
  CheckList bad;
  const ErrorStats s = CheckMapsClose(bad, "params", e, a, {1e-6, 1e-6});
  EXPECT_DOUBLE_EQ(s.max_abs, 0.5);
  EXPECT_NEAR(s.max_rel, 0.5 / 3, 1e-12);
  EXPECT_EQ(bad.failed_count(), 3);  // FQN sets, the aggregate, and "params y"
  EXPECT_THAT(bad.Table(), HasSubstr("params y"));
  EXPECT_THAT(bad.Table(), HasSubstr("unexpected: z"));
}

TEST(ModelZoo, TensorScaledAtolJudgesACancellingElementByItsTensorsMagnitude) {
  // Shards of one gradient on two ranks: rank 1's element 0 cancels to near zero.
  std::vector<reference::RefTensorMap> shards(2);
  shards[0]["g"] = reference::RefTensor({2}, {3.5, -2.0});
  shards[1]["g"] = reference::RefTensor({2}, {-6.4e-4, 1.0});
  shards[0]["b"] = reference::RefTensor({1}, {0.25});
  shards[1]["b"] = reference::RefTensor({1}, {-0.05});
  const std::map<std::string, double> scales = MaxAbsByFqn(shards);
  EXPECT_DOUBLE_EQ(scales.at("g"), 3.5);
  EXPECT_DOUBLE_EQ(scales.at("b"), 0.25);
  const Tolerance tol{1e-5, 1e-4};

  // Rounding of a sum of magnitude-3.5 terms: 2e-5 off, within 1e-5 x 3.5 + 1e-4 x |e|.
  reference::RefTensorMap rounded = shards[1];
  rounded["g"].data[0] += 2e-5;
  CheckList unscaled;
  CheckMapsClose(unscaled, "grads", shards[1], rounded, tol);
  EXPECT_FALSE(unscaled.all_passed());
  CheckList scaled;
  CheckMapsClose(scaled, "grads", shards[1], rounded, tol, &scales);
  EXPECT_TRUE(scaled.all_passed()) << scaled.Table();
  EXPECT_THAT(scaled.checks().front().detail, HasSubstr("x max(1, the tensor's max |expected|)"));

  // A real error of the same element (1e-4, beyond 1e-5 x 3.5), and an error of a tensor whose
  // magnitude is below 1 (atol is never scaled down), still fail.
  reference::RefTensorMap wrong = shards[1];
  wrong["g"].data[0] += 1e-4;
  CheckList caught;
  CheckMapsClose(caught, "grads", shards[1], wrong, tol, &scales);
  EXPECT_EQ(caught.failed_count(), 2);  // the aggregate and "grads g"
  EXPECT_THAT(caught.Table(), HasSubstr("grads g"));
  reference::RefTensorMap small = shards[1];
  small["b"].data[0] += 2e-5;
  CheckList small_caught;
  CheckMapsClose(small_caught, "grads", shards[1], small, tol, &scales);
  EXPECT_FALSE(small_caught.all_passed());
}

TEST(ModelZoo, ParityDefaultLossIsBoundedBelow) {
  // (out * out).sum() for a linear output; the seeds' out.sum() where the output is a ReLU's.
  for (const ZooModelKind& kind : ZooModel::Kinds()) {
    const ParamSpec loss = LossParam(kind);
    ASSERT_EQ(loss.values.size(), 1u) << kind.name;
    EXPECT_EQ(loss.values.front(), kind.relu_output ? "sum" : "squares") << kind.name;
  }
  EXPECT_TRUE(ZooModel::Kind("nontensor_activations").relu_output);
  EXPECT_FALSE(ZooModel::Kind("transformer").relu_output);
  EXPECT_FALSE(ZooModel::Kind("mlp").relu_output);
}

TEST(ModelZoo, UnknownKindsAndOptimizersAreNamed) {
  try {
    ZooModel::Kind("resnet");
    FAIL() << "expected NotFound";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("models: transformer, mlp"));
  }
  OptimConfig c;
  c.kind = "lbfgs";
  EXPECT_THROW(MakeOracleOptimizer(c), Error);
}

}  // namespace
}  // namespace fsdp::conformance
