// Finite-difference checks (float64) of the tiny test ops, the engine's own gradient
// kernels (sums over float32/float64/float16/bfloat16, sum_to) and validate_outputs.
#include <cmath>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/autograd/grad_kernels.h"
#include "engine/testing/autograd_test_util.h"

namespace fsdp::autograd {
namespace {

using ::testing::HasSubstr;
using testing::Filled;
using testing::Mat;

using OpFn = std::function<Tensor(const TensorList&)>;

// Compares d(sum(f(inputs) * r))/d(input) from backward with central differences.
void GradCheck(const std::string& name, const OpFn& f, TensorList inputs) {
  for (Tensor& t : inputs) t.set_requires_grad(true);
  const Tensor out0 = f(inputs);
  const Tensor r = Filled(1, out0.numel(), 777).view(out0.sizes());
  auto objective = [&](const TensorList& in) {
    NoGradGuard no_grad;
    const std::vector<double> y = f(in).to_doubles();
    const std::vector<double> w = r.to_doubles();
    double total = 0;
    for (size_t i = 0; i < y.size(); ++i) total += y[i] * w[i];
    return total;
  };
  testing::Sum(testing::Mul(f(inputs), r)).backward();
  const double eps = 1e-6;
  for (size_t k = 0; k < inputs.size(); ++k) {
    ASSERT_TRUE(inputs[k].grad().defined()) << name << " input " << k;
    const std::vector<double> analytic = inputs[k].grad().to_doubles();
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      TensorList plus, minus;
      for (size_t j = 0; j < inputs.size(); ++j) {
        plus.push_back(inputs[j].detach().clone());
        minus.push_back(inputs[j].detach().clone());
      }
      plus[k].data<double>()[i] += eps;
      minus[k].data<double>()[i] -= eps;
      const double numeric = (objective(plus) - objective(minus)) / (2 * eps);
      EXPECT_NEAR(analytic[static_cast<size_t>(i)], numeric, 1e-6 * (1 + std::fabs(numeric)))
          << name << " input " << k << " element " << i;
    }
  }
}

TEST(AutogradGradcheckTest, TinyOpsMatchFiniteDifferences) {
  GradCheck("T", [](const TensorList& in) { return testing::T(in[0]); }, {Filled(2, 3, 1)});
  GradCheck("Addmm", [](const TensorList& in) { return testing::Addmm(in[0], in[1], in[2]); },
            {Filled(1, 4, 1), Filled(3, 2, 2), Filled(2, 4, 3)});
  GradCheck("Mm", [](const TensorList& in) { return testing::Mm(in[0], in[1]); },
            {Filled(3, 2, 4), Filled(2, 5, 5)});
  GradCheck("Relu", [](const TensorList& in) { return testing::Relu(in[0]); }, {Filled(3, 4, 6)});
  GradCheck("Sum", [](const TensorList& in) { return testing::Sum(in[0]); }, {Filled(2, 3, 7)});
  GradCheck("Add", [](const TensorList& in) { return testing::Add(in[0], in[1]); },
            {Filled(2, 3, 8), Filled(2, 3, 9)});
  GradCheck("Mul", [](const TensorList& in) { return testing::Mul(in[0], in[1]); },
            {Filled(2, 3, 10), Filled(2, 3, 11)});
  GradCheck("Cat", [](const TensorList& in) { return testing::Cat(in); },
            {Filled(1, 2, 12), Filled(2, 2, 13)});
  GradCheck("Dropout", [](const TensorList& in) {
    RankContext::Current().generator() = Generator(99);
    return testing::Dropout(in[0], 0.3);
  }, {Filled(3, 3, 14)});
  GradCheck("Linear", [](const TensorList& in) {
    return testing::Linear(in[0], testing::LinearParams{in[1], in[2]});
  }, {Filled(3, 4, 15), Filled(2, 4, 16), Filled(1, 2, 17)});
}

TEST(AutogradGradcheckTest, SumKernelsOverFloatTypes) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    Tensor a = Tensor::from_doubles({1.5, -2.0, 0.25}, {3}, dtype);
    Tensor b = Tensor::from_doubles({0.5, 4.0, 0.25}, {3}, dtype);
    Tensor sum = kernels::Add(a, b);
    EXPECT_EQ(sum.dtype(), dtype);
    EXPECT_EQ(sum.to_doubles(), (std::vector<double>{2.0, 2.0, 0.5})) << DTypeName(dtype);
    kernels::AddInPlace(a, b);
    EXPECT_EQ(a.to_doubles(), (std::vector<double>{2.0, 2.0, 0.5})) << DTypeName(dtype);
  }
  Tensor wide = Mat(2, 3, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(kernels::SumTo(wide, {1, 3}).to_doubles(), (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(kernels::SumTo(wide, {2, 1}).to_doubles(), (std::vector<double>{6, 15}));
  EXPECT_EQ(kernels::SumTo(wide, {3}).to_doubles(), (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(kernels::SumTo(wide, {}).to_doubles(), (std::vector<double>{21}));
}

TEST(AutogradGradcheckTest, ValidateOutputsReducesCastsAndRejects) {
  // A float32 leaf of shape [1, 3] whose op returns a float64 [2, 3] gradient: summed, cast.
  Tensor w = Tensor::from_doubles({1, 2, 3}, {1, 3}, DType::kFloat32);
  w.set_requires_grad(true);
  Tensor out = record_function("BroadcastBackward", {w}, Mat(2, 3, {0, 0, 0, 0, 0, 0}),
                               [](const TensorList& g) { return TensorList{g[0]}; });
  testing::Sum(out).backward();
  EXPECT_EQ(w.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(w.grad().to_doubles(), (std::vector<double>{2, 2, 2}));

  Tensor bad = record_function("BadShapeBackward", {w}, Mat(1, 3, {0, 0, 0}), [](const TensorList&) {
    return TensorList{Tensor::ones({4}, DType::kFloat32)};
  });
  try {
    testing::Sum(bad).backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Function BadShapeBackward returned an invalid gradient at "
                                    "index 0 - got [4] but expected shape compatible with [1, 3]"));
  }
  Tensor count = record_function("CountBackward", {w}, Mat(1, 3, {0, 0, 0}), [](const TensorList& g) {
    return TensorList{g[0], g[0]};
  });
  try {
    testing::Sum(count).backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Function CountBackward returned an invalid number of "
                                    "gradients - expected 1, but got 2"));
  }
}

TEST(AutogradGradcheckTest, TensorAutogradAccessors) {
  Tensor t = Mat(1, 2, {1, 2});
  EXPECT_FALSE(t.requires_grad());
  EXPECT_TRUE(t.is_leaf());
  t.set_requires_grad(true);
  EXPECT_TRUE(t.requires_grad());
  Tensor ints = Tensor::from_int64s({1, 2}, {2});
  try {
    ints.set_requires_grad(true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("only Tensors of floating point dtype can require gradients"));
  }
  Tensor y = testing::Relu(t);
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.output_nr(), 0u);
  EXPECT_THROW(y.set_requires_grad(false), Error);
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.storage(), y.storage());
  EXPECT_THROW(t.set_grad(Tensor::ones({3}, DType::kFloat64)), Error);
  EXPECT_THROW(t.set_grad(Tensor::ones({1, 2}, DType::kFloat32)), Error);
  t.set_grad(Tensor::ones({1, 2}, DType::kFloat64));
  EXPECT_EQ(t.grad().to_doubles(), (std::vector<double>{1, 1}));
}

}  // namespace
}  // namespace fsdp::autograd
