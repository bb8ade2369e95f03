// Test helpers for the engine/ops tests (header-only, included by *_test.cc files only):
// seeded random tensors and finite-difference gradient checks in float64.
// Test-only (library fsdp_testing, engine/testing/; never part of fsdp_engine). Ownership:
// returns new tensors.
// Thread-safety: stateless functions (each call uses its own Generator).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace fsdp::ops::testing {

// Standard-normal float64 (or `dtype`) values from a fresh Generator(seed).
inline Tensor Randn(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64) {
  Generator g(seed);
  return Tensor::randn(shape, dtype, &g);
}

// Uniform values in [lo, hi) as float64.
inline Tensor Uniform(const Shape& shape, uint64_t seed, double lo, double hi) {
  Generator g(seed);
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  for (double& x : v) x = lo + (hi - lo) * g.uniform_double();
  return Tensor::from_doubles(v, shape, DType::kFloat64);
}

inline double Dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to_doubles(), vb = b.to_doubles();
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += va[i] * vb[i];
  return s;
}

// Forward: inputs -> output. Backward: (upstream grad, inputs) -> one gradient per input
// (undefined where not checked).
using ForwardFn = std::function<Tensor(const std::vector<Tensor>&)>;
using BackwardFn = std::function<std::vector<Tensor>(const Tensor&, const std::vector<Tensor>&)>;

// Checks every float64 input's analytic gradient of L = <G, f(inputs)> (G a seeded random
// upstream gradient) against central finite differences with step `h`:
// |numeric - analytic| <= tol * (1 + |numeric|) elementwise.
inline void ExpectGradientsMatch(const ForwardFn& f, const BackwardFn& backward, std::vector<Tensor> inputs,
                                 const std::string& what, double h = 1e-6, double tol = 1e-6,
                                 uint64_t seed = 1234) {
  const Tensor out = f(inputs);
  const Tensor upstream = Randn(out.sizes(), seed, out.dtype());
  const std::vector<Tensor> analytic = backward(upstream, inputs);
  ASSERT_EQ(analytic.size(), inputs.size()) << what;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!analytic[i].defined()) continue;
    ASSERT_EQ(inputs[i].dtype(), DType::kFloat64) << what << " input " << i;
    ASSERT_EQ(analytic[i].sizes(), inputs[i].sizes()) << what << " gradient " << i;
    const std::vector<double> ana = analytic[i].to_doubles();
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      std::vector<Tensor> probe = inputs;
      probe[i] = inputs[i].clone();
      double* p = probe[i].data<double>();
      const double x0 = p[j];
      p[j] = x0 + h;
      const double lp = Dot(upstream, f(probe));
      p[j] = x0 - h;
      const double lm = Dot(upstream, f(probe));
      const double numeric = (lp - lm) / (2 * h);
      EXPECT_NEAR(ana[static_cast<size_t>(j)], numeric, tol * (1 + std::fabs(numeric)))
          << what << ": d/d input " << i << " element " << j;
    }
  }
}

inline void ExpectValues(const Tensor& t, const std::vector<double>& expected, double tol, const std::string& what) {
  const std::vector<double> v = t.to_doubles();
  ASSERT_EQ(v.size(), expected.size()) << what;
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], tol) << what << " element " << i;
}

}  // namespace fsdp::ops::testing
