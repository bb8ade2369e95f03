// Test helpers shared by the engine/nn unit tests (header-only, included by *_test.cc only):
// a fixed-coefficient loss over every tensor of a Value and a central-finite-difference
// gradient check in float64.
// Test-only (library fsdp_testing, engine/testing/; never part of fsdp_engine). Ownership:
// borrows the module and values it is given; returns new tensors.
// Thread-safety: uses the calling thread's rank generator.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/core/rank_context.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace fsdp::nn::testing {

// sum_k sum(t_k * c_k) over the tensors t_k of `out`, with fixed coefficients
// c_k[i] = sin(1 + i + 7k) (so that every output element matters differently).
inline Tensor WeightedSum(const Value& out) {
  Tensor total;
  const std::vector<Tensor> tensors = out.tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    std::vector<double> c(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < c.size(); ++i) c[i] = std::sin(1.0 + static_cast<double>(i) + 7.0 * k);
    Tensor term = ::fsdp::sum(t * Tensor::from_doubles(c, t.sizes(), t.dtype()));
    total = total.defined() ? total + term : term;
  }
  return total;
}

// The scalar the gradient check differentiates: reseeds the rank generator (identical dropout
// masks on every evaluation), runs `forward` and reduces with WeightedSum.
using ForwardFn = std::function<Value(Module& model)>;

inline Tensor SeededLoss(Module& model, const ForwardFn& forward) {
  ManualSeed(1234);
  return WeightedSum(forward(model));
}

// Runs forward + backward once, then compares the gradient of every parameter named in
// `fqns` (at its first, middle and last element) with a central finite difference of step
// `h`. The model must already be float64.
inline void ExpectGradientsMatchFiniteDifferences(Module& model, const ForwardFn& forward,
                                                  const std::vector<std::string>& fqns,
                                                  double h = 1e-6, double tol = 1e-6) {
  model.zero_grad();
  Tensor loss = SeededLoss(model, forward);
  ASSERT_EQ(loss.dtype(), DType::kFloat64);
  loss.backward();
  for (const std::string& fqn : fqns) {
    Tensor p = model.get_parameter(fqn);
    ASSERT_EQ(p.dtype(), DType::kFloat64) << fqn;
    Tensor grad = p.grad();
    ASSERT_TRUE(grad.defined()) << fqn << " has no grad";
    const std::vector<double> analytic = grad.to_doubles();
    const int64_t n = p.numel();
    std::vector<int64_t> indices = {0, n / 2, n - 1};
    indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    double* data = p.data<double>();
    for (int64_t i : indices) {
      const double saved = data[i];
      double plus = 0.0;
      double minus = 0.0;
      {
        autograd::NoGradGuard no_grad;
        data[i] = saved + h;
        plus = SeededLoss(model, forward).item();
        data[i] = saved - h;
        minus = SeededLoss(model, forward).item();
        data[i] = saved;
      }
      const double fd = (plus - minus) / (2.0 * h);
      EXPECT_NEAR(analytic[static_cast<size_t>(i)], fd, tol * std::max(1.0, std::abs(fd)))
          << fqn << "[" << i << "]";
    }
  }
}

}  // namespace fsdp::nn::testing
