#include "reference/gradient_check.h"

#include <gtest/gtest.h>

#include <cmath>

#include "reference/models.h"

namespace fsdp::reference {
namespace {

TEST(NumericalGradientsTest, SquaredNorm) {
  const RefTensorMap at = {{"x", RefTensor({3}, {1, -2, 0.5})}};
  const RefTensorMap g = NumericalGradients(
      [](const RefTensorMap& m) {
        double s = 0;
        for (double v : m.at("x").data) s += v * v;
        return s;
      },
      at);
  EXPECT_NEAR(g.at("x")[0], 2, 1e-8);
  EXPECT_NEAR(g.at("x")[1], -4, 1e-8);
  EXPECT_NEAR(g.at("x")[2], 1, 1e-8);
}

TEST(NumericalGradientsTest, SamplingKeepsFirstAndLastAndMarksTheRestNaN) {
  const RefTensorMap at = {{"x", RefTensor({10})}};
  FiniteDifferenceOptions o;
  o.max_entries_per_tensor = 3;
  const RefTensorMap g = NumericalGradients(
      [](const RefTensorMap& m) { return m.at("x")[0] + 2 * m.at("x")[9]; }, at, o);
  EXPECT_NEAR(g.at("x")[0], 1, 1e-9);
  EXPECT_NEAR(g.at("x")[9], 2, 1e-9);
  EXPECT_NEAR(g.at("x")[4], 0, 1e-9);  // 4 = 1 * 9 / 2
  EXPECT_TRUE(std::isnan(g.at("x")[1]));
}

TEST(CompareToNumericalTest, DetectsWrongAndMissingGradients) {
  const RefTensorMap numerical = {{"a", RefTensor({2}, {1.0, 2.0})}, {"z", RefTensor({1}, {0})}};
  RefTensorMap analytic = {{"a", RefTensor({2}, {1.0, 2.0})}};
  EXPECT_FALSE(CompareToNumerical(analytic, numerical, 1e-6, 1e-9).ok);  // "z" missing
  EXPECT_TRUE(CompareToNumerical(analytic, numerical, 1e-6, 1e-9, true).ok);
  analytic["a"][1] = 2.0001;
  const GradientCheckResult r = CompareToNumerical(analytic, numerical, 1e-6, 1e-9, true);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("'a'[1]"), std::string::npos) << r.message;
}

// A model whose backward is slightly wrong: the check must notice.
class WrongBackward : public MlpModule<double> {
 public:
  BackwardResult<double> Backward(
      const RefTensorMap& params, const RefTensorMap& buffers, const ModelInput<double>& input,
      const std::vector<std::optional<RefTensor>>& output_grads) const override {
    BackwardResult<double> r = MlpModule<double>::Backward(params, buffers, input, output_grads);
    r.grads.at("net1.bias")[3] *= 1.001;
    return r;
  }
};

TEST(CheckModelGradientsTest, CatchesAWrongBackward) {
  const MlpModule<double> good;
  const WrongBackward bad;
  const RefTensorMap p = UniformTensors<double>(good.ParameterSpecs(), 1, -0.5, 0.5);
  ModelInput<double> in;
  in.features = UniformTensor<double>({3, 10}, 2, -1, 1);
  EXPECT_TRUE(CheckModelGradients(good, p, {}, in, 3, 1e-6, 1e-8).ok);
  const GradientCheckResult r = CheckModelGradients(bad, p, {}, in, 3, 1e-6, 1e-8);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("net1.bias"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace fsdp::reference
