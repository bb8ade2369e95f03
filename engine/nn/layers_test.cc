#include "engine/nn/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/core/rank_context.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/testing/nn_test_util.h"

namespace fsdp::nn {
namespace {

using Names = std::vector<std::string>;

template <typename Pairs>
Names NamesOf(const Pairs& pairs) {
  Names out;
  for (const auto& p : pairs) out.push_back(p.first);
  return out;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& expected,
                double tol = 1e-6) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "index " << i;
}

TEST(LayerLinear, ShapesInitAndForward) {
  ManualSeed(3);
  auto lin = std::make_shared<Linear>(4, 3);
  EXPECT_EQ(NamesOf(lin->named_parameters()), (Names{"weight", "bias"}));
  EXPECT_EQ(lin->weight().sizes(), (Shape{3, 4}));
  EXPECT_EQ(lin->bias().sizes(), (Shape{3}));
  EXPECT_TRUE(lin->weight().requires_grad());
  const double bound = 1.0 / std::sqrt(4.0);
  for (double w : lin->weight().to_doubles()) EXPECT_LE(std::abs(w), bound);
  for (double b : lin->bias().to_doubles()) EXPECT_LE(std::abs(b), bound);
  // Deterministic from the rank generator.
  ManualSeed(3);
  auto again = std::make_shared<Linear>(4, 3);
  EXPECT_EQ(again->weight().to_doubles(), lin->weight().to_doubles());
  EXPECT_EQ(again->bias().to_doubles(), lin->bias().to_doubles());
  EXPECT_EQ(lin->repr(), "Linear(in_features=4, out_features=3, bias=True)");

  Tensor x = Tensor::from_doubles({1, 2, 3, 4, -1, 0, 1, 0.5}, {2, 4});
  Tensor y = (*lin)(x).tensor();
  EXPECT_EQ(y.sizes(), (Shape{2, 3}));
  const auto w = lin->weight().to_doubles();
  const auto b = lin->bias().to_doubles();
  const auto xv = x.to_doubles();
  std::vector<double> expected;
  for (int r = 0; r < 2; ++r) {
    for (int o = 0; o < 3; ++o) {
      double acc = b[o];
      for (int i = 0; i < 4; ++i) acc += xv[r * 4 + i] * w[o * 4 + i];
      expected.push_back(acc);
    }
  }
  ExpectNear(y.to_doubles(), expected, 1e-5);

  auto no_bias = std::make_shared<Linear>(4, 3, /*bias=*/false);
  EXPECT_EQ(NamesOf(no_bias->named_parameters()), (Names{"weight"}));
  EXPECT_TRUE(no_bias->has_parameter("bias"));
  EXPECT_FALSE(no_bias->bias().defined());
  EXPECT_EQ(NamesOf(no_bias->state_dict()), (Names{"weight"}));
}

TEST(LayerEmbeddingAndNorms, ShapesAndForward) {
  auto emb = std::make_shared<Embedding>(5, 3);
  EXPECT_EQ(emb->weight().sizes(), (Shape{5, 3}));
  Tensor idx = Tensor::from_int64s({4, 0, 4}, {3});
  Tensor e = (*emb)(idx).tensor();
  EXPECT_EQ(e.sizes(), (Shape{3, 3}));
  const auto w = emb->weight().to_doubles();
  ExpectNear(e.select(0).to_doubles(), {w[12], w[13], w[14]}, 0.0);
  EXPECT_EQ(emb->repr(), "Embedding(5, 3)");

  auto ln = std::make_shared<LayerNorm>(4);
  EXPECT_EQ(NamesOf(ln->named_parameters()), (Names{"weight", "bias"}));
  EXPECT_EQ(ln->parameter("weight").to_doubles(), std::vector<double>(4, 1.0));
  EXPECT_EQ(ln->parameter("bias").to_doubles(), std::vector<double>(4, 0.0));
  EXPECT_EQ(ln->repr(), "LayerNorm((4,), eps=1e-05, elementwise_affine=True)");
  Tensor x = Tensor::from_doubles({1, 2, 3, 4}, {1, 4});
  // mean 2.5, var 1.25.
  const double s = 1.0 / std::sqrt(1.25 + 1e-5);
  ExpectNear((*ln)(x).tensor().to_doubles(), {-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s}, 1e-5);
  auto ln_nobias = std::make_shared<LayerNorm>(4, 1e-5, true, /*bias=*/false);
  EXPECT_EQ(NamesOf(ln_nobias->named_parameters()), (Names{"weight"}));
  auto ln_noaffine = std::make_shared<LayerNorm>(4, 1e-5, /*elementwise_affine=*/false);
  EXPECT_TRUE(ln_noaffine->named_parameters().empty());

  auto rms = std::make_shared<RMSNorm>(4, 1e-6);
  EXPECT_EQ(NamesOf(rms->named_parameters()), (Names{"weight"}));
  const double r = 1.0 / std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  ExpectNear((*rms)(x).tensor().to_doubles(), {r, 2 * r, 3 * r, 4 * r}, 1e-5);
}

TEST(LayerBatchNorm, BuffersRunningStatsAndStateDict) {
  auto bn = std::make_shared<BatchNorm1d>(2);
  EXPECT_EQ(NamesOf(bn->named_parameters()), (Names{"weight", "bias"}));
  EXPECT_EQ(NamesOf(bn->named_buffers()),
            (Names{"running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ(NamesOf(bn->state_dict()),
            (Names{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ(bn->buffer("num_batches_tracked").dtype(), DType::kInt64);
  EXPECT_EQ(bn->buffer("num_batches_tracked").dim(), 0);
  EXPECT_EQ(bn->state_dict().metadata.at(""), 2);

  Tensor x = Tensor::from_doubles({1, 10, 3, 20}, {2, 2});
  Tensor y = (*bn)(x).tensor();
  // Channel 0: values 1, 3 → normalised ±1 (biased var 1); channel 1: 10, 20 → ±1.
  ExpectNear(y.to_doubles(), {-1, -1, 1, 1}, 1e-4);
  EXPECT_EQ(bn->buffer("num_batches_tracked").item(), 1.0);
  // running = 0.9 * running + 0.1 * batch (unbiased var 2 and 50).
  ExpectNear(bn->buffer("running_mean").to_doubles(), {0.2, 1.5});
  ExpectNear(bn->buffer("running_var").to_doubles(), {0.9 + 0.2, 0.9 + 5.0});
  bn->eval();
  Tensor y_eval = (*bn)(x).tensor();
  EXPECT_EQ(bn->buffer("num_batches_tracked").item(), 1.0);
  ExpectNear(y_eval.to_doubles(),
             {(1 - 0.2) / std::sqrt(1.1 + 1e-5), (10 - 1.5) / std::sqrt(5.9 + 1e-5),
              (3 - 0.2) / std::sqrt(1.1 + 1e-5), (20 - 1.5) / std::sqrt(5.9 + 1e-5)},
             1e-4);

  // A hand-built state dict (no metadata) may omit num_batches_tracked, as in PyTorch.
  StateDict sd = bn->state_dict();
  StateDict hand;
  for (const auto& [k, v] : sd) {
    if (k != "num_batches_tracked") hand.insert(k, v);
  }
  auto fresh = std::make_shared<BatchNorm1d>(2);
  EXPECT_TRUE(fresh->load_state_dict(hand).missing_keys.empty());
  // With version-2 metadata it is reported missing.
  hand.metadata.insert("", 2);
  EXPECT_EQ(fresh->load_state_dict(hand, /*strict=*/false).missing_keys,
            (Names{"num_batches_tracked"}));
  EXPECT_EQ(fresh->repr(),
            "BatchNorm1d(2, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
}

TEST(LayerActivations, DropoutReluGeluIdentity) {
  Tensor x = Tensor::from_doubles({-1.0, 0.5, 2.0, -0.25}, {4});
  ExpectNear((*std::make_shared<ReLU>())(x).tensor().to_doubles(), {0, 0.5, 2.0, 0});
  auto gelu = std::make_shared<GELU>();
  const auto g = (*gelu)(x).tensor().to_doubles();
  for (size_t i = 0; i < 4; ++i) {
    const double v = x.to_doubles()[i];
    EXPECT_NEAR(g[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-6);
  }
  EXPECT_THROW(GELU("fast"), Error);
  EXPECT_TRUE((*std::make_shared<Identity>())(x).tensor().is_same(x));

  auto drop = std::make_shared<Dropout>(0.5);
  Tensor big = Tensor::ones({1000});
  const auto d = (*drop)(big).tensor().to_doubles();
  int zeros = 0;
  for (double v : d) {
    EXPECT_TRUE(v == 0.0 || v == 2.0);
    zeros += v == 0.0;
  }
  EXPECT_GT(zeros, 350);
  EXPECT_LT(zeros, 650);
  drop->eval();
  EXPECT_TRUE((*drop)(big).tensor().is_same(big));
  EXPECT_THROW(Dropout(1.5), Error);
  EXPECT_EQ(drop->repr(), "Dropout(p=0.5, inplace=False)");
}

TEST(LayerContainers, SequentialModuleListParameterList) {
  auto seq = std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Linear>(3, 4), std::make_shared<ReLU>(), std::make_shared<Linear>(4, 2)});
  EXPECT_EQ(NamesOf(seq->named_children()), (Names{"0", "1", "2"}));
  EXPECT_EQ(NamesOf(seq->named_parameters()), (Names{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ((*seq)[-1]->type_name(), "Linear");
  EXPECT_THROW((*seq)[3], Error);
  Tensor x = Tensor::ones({5, 3});
  Tensor manual = (*(*seq)[2])((*(*seq)[1])((*(*seq)[0])(x))).tensor();
  EXPECT_EQ((*seq)(x).tensor().to_doubles(), manual.to_doubles());

  auto named = std::make_shared<Sequential>(std::vector<NamedModule>{
      {"first", std::make_shared<ReLU>()}, {"second", std::make_shared<Identity>()}});
  EXPECT_EQ(NamesOf(named->named_children()), (Names{"first", "second"}));

  auto list = std::make_shared<ModuleList>();
  list->append(std::make_shared<Linear>(2, 2));
  list->append(std::make_shared<Linear>(2, 2));
  EXPECT_EQ(list->size(), 2u);
  EXPECT_EQ(NamesOf(list->named_parameters()), (Names{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(list->list().size(), 2u);
  EXPECT_THROW((*list)(Value(x)), Error);  // ModuleList has no forward

  auto params =
      std::make_shared<ParameterList>(std::vector<Tensor>{Tensor::zeros({2}), Tensor::zeros({3})});
  EXPECT_EQ(NamesOf(params->named_parameters()), (Names{"0", "1"}));
  EXPECT_EQ((*params)[1].sizes(), (Shape{3}));
}

TEST(LayerGradients, FiniteDifferencesFloat64) {
  auto seq = std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Linear>(3, 4), std::make_shared<LayerNorm>(4), std::make_shared<GELU>(),
      std::make_shared<RMSNorm>(4), std::make_shared<Linear>(4, 2)});
  seq->to(DType::kFloat64);
  Tensor x = Tensor::randn({5, 3}, DType::kFloat64);
  testing::ExpectGradientsMatchFiniteDifferences(
      *seq, [&](Module& m) { return m(x); },
      {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "4.weight"});

  auto bn = std::make_shared<Sequential>(std::vector<ModulePtr>{std::make_shared<Linear>(3, 4),
                                                                std::make_shared<BatchNorm1d>(4),
                                                                std::make_shared<Linear>(4, 2)});
  bn->to(DType::kFloat64);
  testing::ExpectGradientsMatchFiniteDifferences(*bn, [&](Module& m) { return m(x); },
                                                 {"0.weight", "1.weight", "1.bias", "2.weight"});

  auto emb = std::make_shared<Embedding>(6, 3);
  emb->to(DType::kFloat64);
  Tensor idx = Tensor::from_int64s({5, 0, 5, 2}, {2, 2});
  testing::ExpectGradientsMatchFiniteDifferences(*emb, [&](Module& m) { return m(idx); },
                                                 {"weight"});
}

}  // namespace
}  // namespace fsdp::nn
