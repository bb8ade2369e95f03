#include "engine/ops/activation.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/testing/ops_test_util.h"

namespace fsdp::ops::kernels {
namespace {

using testing::ExpectGradientsMatch;
using testing::ExpectValues;
using testing::Randn;

constexpr DType kF64 = DType::kFloat64;

TEST(KernelActivation, ReluAndGeluValues) {
  ExpectValues(Relu(Tensor::from_doubles({-1, 0, 2}, {3})), {0, 0, 2}, 0, "relu");
  const Tensor x = Tensor::from_doubles({1.0, 0.0, -1.0, 3.0}, {4}, kF64);
  ExpectValues(Gelu(x), {0.8413447460685429, 0.0, -0.15865525393145707, 2.99595030590511}, 1e-15, "gelu");
  ExpectValues(Gelu(x, "tanh"), {0.8411919906082768, 0.0, -0.15880800939172324, 2.996362607918227}, 1e-15,
               "gelu tanh");
  EXPECT_NEAR(Gelu(Tensor::from_doubles({1.0}, {1})).item(), 0.8413447460685429, 1e-7);
  EXPECT_THROW(Gelu(x, "fast"), Error);
  // relu backward uses the output: zero gradient where the output is 0.
  ExpectValues(ReluBackward(Tensor::ones({3}, kF64), Relu(Tensor::from_doubles({-1, 0, 2}, {3}, kF64))), {0, 0, 1}, 0,
               "relu backward");
}

TEST(KernelActivation, Gradients) {
  const Tensor x = Randn({3, 4}, 1);
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Gelu(in[0]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         return std::vector<Tensor>{GeluBackward(g, in[0])};
                       },
                       {x}, "gelu");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Gelu(in[0], "tanh"); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         return std::vector<Tensor>{GeluBackward(g, in[0], "tanh")};
                       },
                       {x}, "gelu tanh");
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Relu(in[0]); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         return std::vector<Tensor>{ReluBackward(g, Relu(in[0]))};
                       },
                       {x}, "relu");
  for (int64_t dim : {0, 1, -1}) {
    ExpectGradientsMatch([dim](const std::vector<Tensor>& in) { return Softmax(in[0], dim); },
                         [dim](const Tensor& g, const std::vector<Tensor>& in) {
                           return std::vector<Tensor>{SoftmaxBackward(g, Softmax(in[0], dim), dim)};
                         },
                         {x}, "softmax");
    ExpectGradientsMatch([dim](const std::vector<Tensor>& in) { return LogSoftmax(in[0], dim); },
                         [dim](const Tensor& g, const std::vector<Tensor>& in) {
                           return std::vector<Tensor>{LogSoftmaxBackward(g, LogSoftmax(in[0], dim), dim)};
                         },
                         {x}, "log_softmax");
  }
  ExpectGradientsMatch([](const std::vector<Tensor>& in) { return Softmax(in[0], 1); },
                       [](const Tensor& g, const std::vector<Tensor>& in) {
                         return std::vector<Tensor>{SoftmaxBackward(g, Softmax(in[0], 1), 1)};
                       },
                       {Randn({2, 3, 2}, 2)}, "softmax middle dim");
}

TEST(KernelActivation, SoftmaxIsStableAndNormalised) {
  const Tensor x = Tensor::from_doubles({1000, 1001, 1002, -5, 0, 5}, {2, 3}, kF64);
  const Tensor s = Softmax(x, -1);
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), z = 1 + e1 + e2;
  ExpectValues(s.narrow(0, 0, 1), {e2 / z, e1 / z, 1 / z}, 1e-15, "softmax large");
  const Tensor ls = LogSoftmax(x, -1);
  ExpectValues(ls.narrow(0, 0, 1), {-2 - std::log(z), -1 - std::log(z), -std::log(z)}, 1e-12, "log_softmax large");
  // A row of -inf except one entry.
  const double inf = INFINITY;
  ExpectValues(Softmax(Tensor::from_doubles({0, -inf, -inf}, {3}, kF64), 0), {1, 0, 0}, 0, "softmax -inf");
  // bfloat16 output rounds once from float.
  const Tensor b = Softmax(Tensor::from_doubles({0, 1}, {2}, DType::kBFloat16), 0);
  EXPECT_EQ(b.dtype(), DType::kBFloat16);
  const float p1 = static_cast<float>(1.0 / (1.0 + std::exp(-1.0)));
  EXPECT_EQ(b.to_doubles()[1], static_cast<double>(static_cast<float>(BFloat16(p1))));
}

}  // namespace
}  // namespace fsdp::ops::kernels
