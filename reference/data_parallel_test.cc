#include "reference/data_parallel.h"

#include <gtest/gtest.h>

#include "reference/models.h"
#include "reference/transformer.h"

namespace fsdp::reference {
namespace {

ModelInput<double> Batch(int64_t rows, int64_t dim, int64_t classes, uint64_t seed) {
  ModelInput<double> in;
  in.features = UniformTensor<double>({rows, dim}, seed, -1, 1);
  in.targets = UniformIndices({rows}, seed + 1, classes);
  return in;
}

RefTensorMap Scaled(RefTensorMap m, double s) {
  for (auto& [name, t] : m) {
    for (double& v : t.data) v *= s;
  }
  return m;
}

void ExpectMapsNear(const RefTensorMap& a, const RefTensorMap& b, double tol) {
  std::string why;
  EXPECT_TRUE(AllCloseMaps(a, b, tol, tol, &why)) << why;
}

TEST(SplitBatchTest, RankRowsAndErrors) {
  const ModelInput<double> global = Batch(6, 3, 4, 1);
  const std::vector<ModelInput<double>> parts = SplitBatch(global, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(*parts[1].features, SliceRows(*global.features, 2, 4));
  EXPECT_EQ(*parts[2].targets, SliceRows(*global.targets, 4, 6));
  EXPECT_FALSE(parts[0].tokens.has_value());
  EXPECT_THROW(SplitBatch(global, 4), std::invalid_argument);  // 6 rows over 4 ranks
  ModelInput<double> mismatched = global;
  mismatched.targets = UniformIndices({5}, 2, 4);
  EXPECT_THROW(SplitBatch(mismatched, 1), std::invalid_argument);
  EXPECT_EQ(ReplicateInput(global, 2)[1].features, global.features);
}

TEST(DataParallelTest, MeanLossAverageEqualsFullBatchGradient) {
  const MlpModule<double> m;
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 3, -0.5, 0.5);
  const ModelInput<double> global = Batch(8, 10, 10, 4);
  for (const LossSpec& loss : {CrossEntropyLoss(Reduction::kMean), MeanLoss()}) {
    const LossAndGrads<double> full = ForwardBackward(m, p, {}, global, loss);
    for (int world : {1, 2, 4, 8}) {
      std::vector<RefTensorMap> per_rank;
      double loss_sum = 0;
      for (const ModelInput<double>& in : SplitBatch(global, world)) {
        const LossAndGrads<double> lg = ForwardBackward(m, p, {}, in, loss);
        per_rank.push_back(lg.grads);
        loss_sum += lg.loss;
      }
      ExpectMapsNear(AverageGradients(per_rank), full.grads, 1e-12);
      EXPECT_NEAR(loss_sum / world, full.loss, 1e-12);  // mean of per-rank means
    }
  }
}

TEST(DataParallelTest, SumLossAverageIsFullBatchGradientOverWorld) {
  const MlpModule<double> m;
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 5, -0.5, 0.5);
  const ModelInput<double> global = Batch(8, 10, 10, 6);
  for (const LossSpec& loss : {SumLoss(), CrossEntropyLoss(Reduction::kSum)}) {
    const LossAndGrads<double> full = ForwardBackward(m, p, {}, global, loss);
    const int world = 4;
    TrainingStep<double> step;
    step.rank_inputs = SplitBatch(global, world);
    step.loss = loss;
    step.optimizer_step = false;
    const std::vector<StepRecord<double>> rec =
        RunDataParallelTraining<double>(m, p, {}, {step}, nullptr);
    double loss_sum = 0;
    for (double l : rec[0].rank_losses) loss_sum += l;
    EXPECT_NEAR(loss_sum, full.loss, 1e-12);  // all_reduce(SUM) of the losses
    ExpectMapsNear(rec[0].grads, Scaled(full.grads, 1.0 / world), 1e-12);
    ExpectMapsNear(rec[0].params, p, 0);  // no optimizer step
  }
}

TEST(DataParallelTest, SgdTrainingMatchesHandWrittenFullBatchLoop) {
  const TpSimpleModel<double> m;
  const RefTensorMap p0 = UniformTensors<double>(m.ParameterSpecs(), 7, -0.5, 0.5);
  const ModelInput<double> global = Batch(6, 5, 12, 8);
  SgdOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  Sgd<double> sgd(o);
  const LossSpec loss = CrossEntropyLoss(Reduction::kMean);
  const std::vector<StepRecord<double>> rec =
      RunDataParallelTraining(m, p0, {}, global, /*world_size=*/3, /*num_steps=*/4, loss, &sgd);
  ASSERT_EQ(rec.size(), 4u);

  // The same thing written out: full-batch mean loss gradient, momentum SGD by hand.
  RefTensorMap p = p0, buf;
  for (int s = 0; s < 4; ++s) {
    const LossAndGrads<double> lg = ForwardBackward(m, p, {}, global, loss);
    ExpectMapsNear(rec[s].grads, lg.grads, 1e-12);
    for (auto& [name, g] : lg.grads) {
      if (s == 0) buf[name] = g;
      for (int64_t i = 0; i < g.numel(); ++i) {
        if (s > 0) buf[name][i] = 0.9 * buf[name][i] + g[i];
        p[name][i] -= 0.05 * buf[name][i];
      }
    }
    ExpectMapsNear(rec[s].params, p, 1e-12);
    ASSERT_EQ(rec[s].rank_losses.size(), 3u);
    EXPECT_EQ(rec[s].lr, 0.05);
  }
}

// TrainingStep::frozen: a parameter with requires_grad=False gets no gradient and keeps its
// value; the others train as if it were a constant.
TEST(DataParallelTest, FrozenParametersGetNoGradientAndKeepTheirValues) {
  const TpSimpleModel<double> m;
  const RefTensorMap p0 = UniformTensors<double>(m.ParameterSpecs(), 7, -0.5, 0.5);
  const std::string frozen = p0.begin()->first;
  TrainingStep<double> step;
  step.rank_inputs = SplitBatch(Batch(6, 5, 12, 8), 2);
  step.loss = CrossEntropyLoss(Reduction::kMean);
  step.frozen = {frozen};
  SgdOptions o;
  o.lr = 0.05;
  Sgd<double> sgd(o);
  const std::vector<StepRecord<double>> rec =
      RunDataParallelTraining<double>(m, p0, {}, {step, step}, &sgd);
  ASSERT_EQ(rec.size(), 2u);
  for (const StepRecord<double>& r : rec) {
    EXPECT_EQ(r.grads.count(frozen), 0u);
    for (const RefTensorMap& g : r.rank_grads) EXPECT_EQ(g.count(frozen), 0u);
    EXPECT_EQ(r.params.at(frozen), p0.at(frozen));
    EXPECT_EQ(r.grads.size(), p0.size() - 1);
  }
  EXPECT_NE(rec[1].params, p0);
}

TEST(DataParallelTest, TransformerTokensSplitAcrossRanks) {
  ModelArgs a;
  a.n_layers = 1;
  a.dim = 8;
  a.n_heads = 2;
  const Transformer<double> m(a);
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 9, -0.3, 0.3);
  ModelInput<double> global;
  global.tokens = UniformIndices({4, 16}, 10, a.vocab_size);
  global.targets = UniformIndices({4, 16}, 11, a.vocab_size);
  const LossSpec loss = CrossEntropyLoss(Reduction::kMean);
  TrainingStep<double> step;
  step.rank_inputs = SplitBatch(global, 2);
  step.loss = loss;
  step.optimizer_step = false;
  const StepRecord<double> rec = RunDataParallelTraining<double>(m, p, {}, {step}, nullptr)[0];
  ExpectMapsNear(rec.grads, ForwardBackward(m, p, {}, global, loss).grads, 1e-12);
  EXPECT_EQ(step.rank_inputs[1].tokens->shape, (Shape{2, 16}));
}

TEST(DataParallelTest, GradientAccumulationWithoutZeroGrad) {
  const MlpModule<double> m;
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 12, -0.5, 0.5);
  const ModelInput<double> b1 = Batch(4, 10, 10, 13), b2 = Batch(4, 10, 10, 14);
  std::vector<TrainingStep<double>> steps(2);
  steps[0].rank_inputs = SplitBatch(b1, 2);
  steps[0].optimizer_step = false;
  steps[0].zero_grad = false;
  steps[1].rank_inputs = SplitBatch(b2, 2);
  SgdOptions o;
  o.lr = 0.1;
  Sgd<double> sgd(o);
  const std::vector<StepRecord<double>> rec = RunDataParallelTraining(m, p, {}, steps, &sgd);
  RefTensorMap expected = Scaled(ForwardBackward(m, p, {}, b1, SumLoss()).grads, 0.5);
  AccumulateGrads(&expected, Scaled(ForwardBackward(m, p, {}, b2, SumLoss()).grads, 0.5));
  ExpectMapsNear(rec[1].grads, expected, 1e-12);
  ExpectMapsNear(rec[0].params, p, 0);
  EXPECT_EQ(rec[0].lr, 0.0);
}

TEST(DataParallelTest, UnusedForwardOutputAndZeroGradSemantics) {
  // test_unused_forward_output's loop: Adam; (out1 * out2).sum() for 3 iterations, then
  // out1.sum(); zero_grad(set_to_none=iter % 2).
  const int world = 2;
  const DoubleLinear<double> m(DoubleLinearConfig{6, true, false});
  const RefTensorMap p0 = UniformTensors<double>(m.ParameterSpecs(), 15, -0.5, 0.5);
  std::vector<TrainingStep<double>> steps;
  for (int it = 0; it < 6; ++it) {
    TrainingStep<double> s;
    s.rank_inputs = SplitBatch(Batch(2 * world, 6, 6, 100 + it), world);
    s.loss = it < 3 ? ProductSumLoss(0, 1) : SumLoss({0});
    s.set_to_none = (it % 2) != 0;
    steps.push_back(s);
  }
  AdamOptions o;
  o.lr = 1e-2;
  Adam<double> adam(o);
  const std::vector<StepRecord<double>> rec = RunDataParallelTraining(m, p0, {}, steps, &adam);
  // Iteration 3: the grads were zeroed (not None) after iteration 2, so lin2 carries a zero
  // gradient, Adam still steps it and its momentum moves it.
  EXPECT_EQ(rec[3].grads.count("lin2.weight"), 1u);
  EXPECT_EQ(rec[3].grads.at("lin2.weight"), RefTensor({6, 6}));
  EXPECT_GT(MaxAbsDiff(rec[3].params.at("lin2.weight"), rec[2].params.at("lin2.weight")), 0.0);
  // Iteration 4: set to None after iteration 3, so lin2 has no gradient and does not move.
  EXPECT_EQ(rec[4].grads.count("lin2.weight"), 0u);
  EXPECT_EQ(rec[4].params.at("lin2.weight"), rec[3].params.at("lin2.weight"));
  // Iteration 5: zero_grad(set_to_none=False) after iteration 4 only zeroes existing grads, so lin2
  // stays None. Adam stepped lin2 in iterations 0..3 only.
  EXPECT_EQ(rec[5].grads.count("lin2.weight"), 0u);
  EXPECT_EQ(adam.steps().at("lin2.weight"), 4);
  EXPECT_EQ(adam.steps().at("lin1.weight"), 6);
}

// FSDP1 flat parameters (Fsdp1FlatParam) on test_unused_forward_output's DoubleLinear: lin1 and
// lin2 are one flat parameter each; lin2 gets no gradient from iteration 3 on.
class Fsdp1FlatParamTest : public ::testing::Test {
 protected:
  static constexpr int kWorld = 2;
  static constexpr int kIters = 5;
  static constexpr double kLr = 0.1;

  std::vector<StepRecord<double>> Run(Fsdp1FlatParam lin2, bool set_to_none, double momentum) {
    const DoubleLinear<double> m(DoubleLinearConfig{6, true, false});
    const RefTensorMap p0 = UniformTensors<double>(m.ParameterSpecs(), 15, -0.5, 0.5);
    std::vector<TrainingStep<double>> steps;
    for (int it = 0; it < kIters; ++it) {
      TrainingStep<double> s;
      s.rank_inputs = SplitBatch(Batch(2 * kWorld, 6, 6, 100 + it), kWorld);
      s.loss = it < 3 ? ProductSumLoss(0, 1) : SumLoss({0});
      s.set_to_none = set_to_none;
      steps.push_back(s);
    }
    Sgd<double> sgd(SgdOptions{.lr = kLr, .momentum = momentum});
    Fsdp1FlatParam lin1 = lin2;
    lin1.params = {"lin1.weight", "lin1.bias"};
    lin2.params = {"lin2.weight", "lin2.bias"};
    return RunDataParallelTraining<double>(m, p0, {}, steps, &sgd, nullptr, {lin1, lin2});
  }
};

TEST_F(Fsdp1FlatParamTest, CpuOffloadStepsTheStaleBuffer) {
  const auto rec = Run({.offload_params = true}, /*set_to_none=*/true, /*momentum=*/0);
  for (int it = 3; it < kIters; ++it) {
    // prepare_gradient_for_optim hands over the buffer of iteration 2's reduction.
    EXPECT_EQ(rec[it].grads.at("lin2.weight"), rec[2].grads.at("lin2.weight"));
    RefTensor stepped = rec[it - 1].params.at("lin2.weight");
    const RefTensor& g = rec[2].grads.at("lin2.weight");
    for (size_t i = 0; i < stepped.data.size(); ++i) stepped.data[i] -= kLr * g.data[i];
    EXPECT_LT(MaxAbsDiff(rec[it].params.at("lin2.weight"), stepped), 1e-12);
  }
}

TEST_F(Fsdp1FlatParamTest, CpuOffloadBufferZeroedByZeroGrad) {
  const auto rec = Run({.offload_params = true}, /*set_to_none=*/false, /*momentum=*/0);
  EXPECT_EQ(rec[3].grads.at("lin2.weight"), RefTensor({6, 6}));
  EXPECT_EQ(rec[3].params.at("lin2.weight"), rec[2].params.at("lin2.weight"));
}

TEST_F(Fsdp1FlatParamTest, UseOrigParamsWithSkippedViewsLeavesNoneGradients) {
  const auto rec = Run({.offload_params = true, .grad_every_backward = false},
                       /*set_to_none=*/true, /*momentum=*/0.9);
  EXPECT_EQ(rec[3].grads.count("lin2.weight"), 0u);
  EXPECT_EQ(rec[4].params.at("lin2.weight"), rec[2].params.at("lin2.weight"));
}

TEST_F(Fsdp1FlatParamTest, KeptUnshardedCopyHidesTheMomentumSteps) {
  // Zeroed (not None) gradients: momentum keeps moving lin2 in the plain model.
  const auto plain = Run({}, /*set_to_none=*/false, /*momentum=*/0.9);
  EXPECT_GT(MaxAbsDiff(plain[4].params.at("lin2.weight"), plain[2].params.at("lin2.weight")), 0.0);
  // SHARD_GRAD_OP keeps iteration 3's unsharded flat parameter: summon_full_params shows it.
  const auto kept = Run({.keeps_unsharded_after_forward = true}, false, 0.9);
  EXPECT_EQ(kept[3].params.at("lin2.weight"), plain[2].params.at("lin2.weight"));
  EXPECT_EQ(kept[4].params.at("lin2.weight"), plain[2].params.at("lin2.weight"));
  EXPECT_LT(MaxAbsDiff(kept[4].params.at("lin1.weight"), plain[4].params.at("lin1.weight")), 1e-12);
  // With parameter mixed precision summon_full_params gathers the stepped full-precision shard.
  const auto summoned =
      Run({.keeps_unsharded_after_forward = true, .full_precision_summon = true}, false, 0.9);
  EXPECT_LT(MaxAbsDiff(summoned[4].params.at("lin2.weight"), plain[4].params.at("lin2.weight")),
            1e-12);
}

TEST_F(Fsdp1FlatParamTest, UnknownParameterIsRefused) {
  const DoubleLinear<double> m(DoubleLinearConfig{6, true, false});
  const RefTensorMap p0 = UniformTensors<double>(m.ParameterSpecs(), 15, -0.5, 0.5);
  TrainingStep<double> s;
  s.rank_inputs = SplitBatch(Batch(2, 6, 6, 1), 1);
  Sgd<double> sgd(SgdOptions{});
  EXPECT_THROW(RunDataParallelTraining<double>(m, p0, {}, {s}, &sgd, nullptr,
                                       {Fsdp1FlatParam{.params = {"lin3.weight"}}}),
               std::invalid_argument);
}

TEST(DataParallelTest, BatchNormBuffersArePerRank) {
  LinearBatchNormLinearConfig c;
  c.dim = 4;
  const LinearBatchNormLinear<double> m(c);
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 16, -0.5, 0.5);
  SgdOptions o;
  o.lr = 0.1;
  Sgd<double> sgd(o);
  const std::vector<StepRecord<double>> rec =
      RunDataParallelTraining(m, p, m.DefaultBuffers(), Batch(8, 4, 4, 17), 2, 2, SumLoss(), &sgd);
  ASSERT_EQ(rec[1].rank_buffers.size(), 2u);
  EXPECT_NE(rec[1].rank_buffers[0].at("1.running_mean"),
            rec[1].rank_buffers[1].at("1.running_mean"));
  EXPECT_EQ(rec[1].rank_buffers[0].at("1.num_batches_tracked"), RefTensor(Shape{}, {2}));
}

TEST(DataParallelTest, SchedulerStepsAfterEachOptimizerStep) {
  const MlpModule<double> m;
  const RefTensorMap p = UniformTensors<double>(m.ParameterSpecs(), 18, -0.5, 0.5);
  Adam<double> adam(AdamWOptions(1e-2));
  StepLr<double> sched(&adam, 2, 0.5);
  const std::vector<StepRecord<double>> rec =
      RunDataParallelTraining(m, p, {}, Batch(4, 10, 10, 19), 2, 5, SumLoss(), &adam, &sched);
  std::vector<double> lrs;
  for (const auto& r : rec) lrs.push_back(r.lr);
  EXPECT_EQ(lrs, (std::vector<double>{1e-2, 1e-2, 5e-3, 5e-3, 2.5e-3}));
}

}  // namespace
}  // namespace fsdp::reference
