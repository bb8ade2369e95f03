#include "reference/optimizers.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fsdp::reference {
namespace {

RefTensorMap One(double p) { return {{"w", RefTensor({1}, {p})}}; }

TEST(SgdTest, PlainStep) {
  RefTensorMap p = {{"w", RefTensor({2}, {1.0, -2.0})}};
  SgdOptions o;
  o.lr = 0.1;
  Sgd<double> sgd(o);
  sgd.Step(&p, {{"w", RefTensor({2}, {0.5, 1.0})}});
  EXPECT_DOUBLE_EQ(p["w"][0], 0.95);
  EXPECT_DOUBLE_EQ(p["w"][1], -2.1);
}

TEST(SgdTest, MaximizeStepsAlongTheGradient) {
  RefTensorMap p = {{"w", RefTensor({2}, {1.0, -2.0})}};
  SgdOptions o;
  o.lr = 0.1;
  o.maximize = true;
  Sgd<double> sgd(o);
  sgd.Step(&p, {{"w", RefTensor({2}, {0.5, 1.0})}});
  EXPECT_DOUBLE_EQ(p["w"][0], 1.05);
  EXPECT_DOUBLE_EQ(p["w"][1], -1.9);
}

TEST(SgdTest, MomentumTwoStepsByHand) {
  RefTensorMap p = {{"w", RefTensor({2}, {1.0, -2.0})}};
  const RefTensorMap g = {{"w", RefTensor({2}, {0.5, 1.0})}};
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  Sgd<double> sgd(o);
  // Step 1: buf = grad (no dampening on the first step); p -= 0.1 * buf.
  sgd.Step(&p, g);
  EXPECT_DOUBLE_EQ(sgd.momentum_buffers().at("w")[0], 0.5);
  EXPECT_NEAR(p["w"][0], 0.95, 1e-15);
  EXPECT_NEAR(p["w"][1], -2.1, 1e-15);
  // Step 2: buf = 0.9 * [0.5, 1] + [0.5, 1] = [0.95, 1.9]; p -= 0.1 * buf.
  sgd.Step(&p, g);
  EXPECT_NEAR(sgd.momentum_buffers().at("w")[1], 1.9, 1e-15);
  EXPECT_NEAR(p["w"][0], 0.855, 1e-15);
  EXPECT_NEAR(p["w"][1], -2.29, 1e-15);
}

TEST(SgdTest, NesterovDampeningAndWeightDecayByHand) {
  {
    RefTensorMap p = One(1.0);
    SgdOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.nesterov = true;
    Sgd<double> sgd(o);
    sgd.Step(&p, One(0.5));  // buf = 0.5; g = 0.5 + 0.9 * 0.5 = 0.95
    EXPECT_NEAR(p["w"][0], 1 - 0.095, 1e-15);
  }
  {
    RefTensorMap p = One(1.0);
    SgdOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.dampening = 0.5;
    o.weight_decay = 0.1;
    Sgd<double> sgd(o);
    sgd.Step(&p, One(0.5));  // g = 0.5 + 0.1 * 1 = 0.6; buf = 0.6; p = 1 - 0.06 = 0.94
    EXPECT_NEAR(p["w"][0], 0.94, 1e-15);
    sgd.Step(&p, One(0.5));  // g = 0.5 + 0.094 = 0.594; buf = 0.54 + 0.297 = 0.837
    EXPECT_NEAR(sgd.momentum_buffers().at("w")[0], 0.837, 1e-15);
    EXPECT_NEAR(p["w"][0], 0.94 - 0.0837, 1e-15);
  }
  SgdOptions bad;
  bad.nesterov = true;
  EXPECT_THROW(Sgd<double>{bad}, std::invalid_argument);
}

TEST(AdamTest, TwoStepsByHand) {
  RefTensorMap p = One(1.0);
  AdamOptions o;
  o.lr = 0.1;
  Adam<double> adam(o);
  // Step 1: m = 0.05, v = 0.00025, bias corrections 0.1 and 0.001: step_size = 1,
  // denom = sqrt(0.00025) / sqrt(0.001) + 1e-8 = 0.5 + 1e-8.
  adam.Step(&p, One(0.5));
  EXPECT_NEAR(adam.exp_avg().at("w")[0], 0.05, 1e-16);
  EXPECT_NEAR(adam.exp_avg_sq().at("w")[0], 0.00025, 1e-18);
  EXPECT_EQ(adam.steps().at("w"), 1);
  EXPECT_NEAR(p["w"][0], 0.900000002, 1e-15);
  // Step 2 (g = 0.25): m = 0.07, v = 0.00031225, bias corrections 0.19 and 0.001999:
  // p -= (0.1 / 0.19) * 0.07 / (sqrt(0.00031225) / sqrt(0.001999) + 1e-8).
  adam.Step(&p, One(0.25));
  EXPECT_NEAR(adam.exp_avg().at("w")[0], 0.07, 1e-16);
  EXPECT_NEAR(adam.exp_avg_sq().at("w")[0], 0.00031225, 1e-18);
  EXPECT_NEAR(p["w"][0], 0.8067820404774623, 1e-14);
}

TEST(AdamTest, AmsgradUsesTheRunningMaxOfTheSecondMoment) {
  AdamOptions o;
  o.lr = 0.1;
  o.amsgrad = true;
  RefTensorMap p = One(1.0);
  Adam<double> adam(o);
  adam.Step(&p, One(0.5));  // v = 0.00025 = vmax; the step of TwoStepsByHand
  EXPECT_NEAR(p["w"][0], 0.900000002, 1e-15);
  // Step 2 (g = 0): m = 0.045, v = 0.999 * 0.00025 drops, vmax stays 0.00025.
  adam.Step(&p, One(0.0));
  EXPECT_NEAR(adam.exp_avg_sq().at("w")[0], 0.00024975, 1e-18);
  const double denom = std::sqrt(0.00025) / std::sqrt(1 - 0.999 * 0.999) + 1e-8;
  EXPECT_NEAR(p["w"][0], 0.900000002 - (0.1 / 0.19) * 0.045 / denom, 1e-14);
}

TEST(AdamTest, CoupledVersusDecoupledWeightDecay) {
  AdamOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.01;
  // Adam: g = 0.5 + 0.01 * 1 = 0.51, first step moves by lr * 0.51 / (0.51 + 1e-8).
  RefTensorMap pa = One(1.0);
  Adam<double> adam(o);
  adam.Step(&pa, One(0.5));
  EXPECT_NEAR(pa["w"][0], 1 - 0.1 * 0.51 / (0.51 + 1e-8), 1e-15);
  // AdamW: p *= 1 - lr * wd = 0.999, then the plain Adam step of g = 0.5.
  RefTensorMap pw = One(1.0);
  AdamW<double> adamw(o);
  adamw.Step(&pw, One(0.5));
  EXPECT_NEAR(pw["w"][0], 0.999 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  // AdamW's default weight decay is 1e-2, Adam's 0.
  EXPECT_EQ(AdamWOptions().weight_decay, 1e-2);
  EXPECT_EQ(AdamOptions().weight_decay, 0.0);
}

TEST(OptimizerTest, AbsentGradientsAreSkipped) {
  RefTensorMap p = {{"a", RefTensor({1}, {1.0})}, {"b", RefTensor({1}, {2.0})}};
  AdamOptions o;
  o.lr = 0.1;
  Adam<double> adam(o);
  adam.Step(&p, {{"a", RefTensor({1}, {0.5})}});  // b has grad None
  EXPECT_EQ(p["b"][0], 2.0);
  EXPECT_EQ(adam.steps().count("b"), 0u);
  adam.Step(&p, {{"a", RefTensor({1}, {0.5})}, {"b", RefTensor({1}, {0.5})}});
  EXPECT_EQ(adam.steps().at("a"), 2);
  EXPECT_EQ(adam.steps().at("b"), 1);  // b's first step: full first-step bias correction
  EXPECT_NEAR(p["b"][0], 2.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);

  SgdOptions so;
  so.lr = 1;
  so.momentum = 0.9;
  Sgd<double> sgd(so);
  sgd.Step(&p, {});
  EXPECT_TRUE(sgd.momentum_buffers().empty());
  EXPECT_THROW(sgd.Step(&p, {{"c", RefTensor({1})}}), std::invalid_argument);
}

TEST(StepLrTest, DecaysEveryStepSize) {
  SgdOptions o;
  o.lr = 1.0;
  Sgd<double> sgd(o);
  StepLr<double> sched(&sgd, /*step_size=*/2, /*gamma=*/0.5);
  std::vector<double> lrs;
  for (int i = 0; i < 5; ++i) {
    lrs.push_back(sgd.lr());
    sched.Step();
  }
  EXPECT_EQ(lrs, (std::vector<double>{1.0, 1.0, 0.5, 0.5, 0.25}));
  EXPECT_EQ(sched.last_epoch(), 5);
  EXPECT_EQ(sched.last_lr(), 0.25);
}

TEST(ParamGroupTest, EachParameterStepsWithItsGroupsLr) {
  RefTensorMap p = {{"a", RefTensor({1}, {1.0})}, {"b", RefTensor({1}, {1.0})}};
  const RefTensorMap g = {{"a", RefTensor({1}, {1.0})}, {"b", RefTensor({1}, {1.0})}};
  SgdOptions o;
  o.lr = 0.1;
  Sgd<double> sgd(o);
  sgd.AddParamGroup({"b"}, 0.5);
  EXPECT_THROW(sgd.AddParamGroup({"b"}, 0.2), std::invalid_argument);
  EXPECT_THROW(sgd.AddParamGroup({"c"}, -1.0), std::invalid_argument);
  sgd.Step(&p, g);
  EXPECT_DOUBLE_EQ(p["a"][0], 0.9);
  EXPECT_DOUBLE_EQ(p["b"][0], 0.5);
  // StepLR scales every group.
  StepLr<double> sched(&sgd, /*step_size=*/1, /*gamma=*/0.5);
  sched.Step();
  EXPECT_DOUBLE_EQ(sgd.LrOf("a"), 0.05);
  EXPECT_DOUBLE_EQ(sgd.LrOf("b"), 0.25);
  // Adam's step size is the group's lr on the first step (|m̂ / sqrt(v̂)| = 1).
  AdamOptions ao;
  ao.lr = 0.1;
  Adam<double> adam(ao);
  adam.AddParamGroup({"b"}, 0.3);
  RefTensorMap q = {{"a", RefTensor({1}, {0.0})}, {"b", RefTensor({1}, {0.0})}};
  adam.Step(&q, g);
  EXPECT_NEAR(q["a"][0], -0.1, 1e-7);
  EXPECT_NEAR(q["b"][0], -0.3, 1e-7);
}

TEST(GradBookkeepingTest, ZeroGradAndAccumulate) {
  RefTensorMap g = {{"a", RefTensor({2}, {1, 2})}};
  AccumulateGrads(&g, {{"a", RefTensor({2}, {10, 20})}, {"b", RefTensor({1}, {5})}});
  EXPECT_EQ(g.at("a"), RefTensor({2}, {11, 22}));
  EXPECT_EQ(g.at("b"), RefTensor({1}, {5}));
  RefTensorMap z = g;
  ZeroGrad(&z, /*set_to_none=*/false);
  EXPECT_EQ(z.at("a"), RefTensor({2}, {0, 0}));
  EXPECT_EQ(z.size(), 2u);
  ZeroGrad(&g, /*set_to_none=*/true);
  EXPECT_TRUE(g.empty());
}

TEST(FloatOptimizerTest, FloatAdamTracksDouble) {
  AdamOptions o;
  o.lr = 1e-2;
  Adam<double> ad(o);
  Adam<float> af(o);
  RefTensorMap pd = {{"w", UniformTensor<double>({6}, 1, -1, 1)}};
  TensorMap<float> pf = CastMap<float>(pd);
  for (int step = 0; step < 5; ++step) {
    const RefTensorMap g = {{"w", UniformTensor<double>({6}, 10 + step, -1, 1)}};
    ad.Step(&pd, g);
    af.Step(&pf, CastMap<float>(g));
  }
  EXPECT_LT(MaxAbsDiff(CastTensor<double>(pf.at("w")), pd.at("w")), 1e-6);
}

}  // namespace
}  // namespace fsdp::reference
