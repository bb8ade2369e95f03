// Host tests of update_math.h, the per-element optimizer formulas shared by the CPU loops and
// the CUDA kernels: known values of single updates, the lerp branches, the float16/bfloat16
// storage rounding (bit-for-bit the conversions of fsdp::Half / fsdp::BFloat16), a whole
// half-precision update against the op sequence written with the core types, and the CUDA
// kernels' loop bodies (runtime dtype, raw storage) run on the host against the optimizers.
#include "engine/optim/update_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/optim/adam.h"
#include "engine/optim/sgd.h"
#include "engine/optim/update_kernels.h"

namespace fsdp::optim::math {
namespace {

// The bit views of numerics.h (the ones the device code uses).
uint32_t Bits(float f) { return ops::kernels::cuda::FloatBits(f); }
float FromBits(uint32_t u) { return ops::kernels::cuda::BitsFloat(u); }

// Floats that exercise the float16/bfloat16 conversions: a stride over every bit pattern
// (normals, subnormals, infinities, NaNs of both signs) plus the exact halfway points between
// neighbouring float16 and bfloat16 values (ties to even) and their float neighbours.
std::vector<float> ConversionSamples() {
  std::vector<float> out;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 65521)
    out.push_back(FromBits(static_cast<uint32_t>(u)));
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    const float lo = HalfBitsToFloat(static_cast<uint16_t>(h));
    const float hi = HalfBitsToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (lo + hi) / 2;  // exact in float
    out.insert(out.end(), {mid, std::nextafter(mid, lo), std::nextafter(mid, hi)});
    const uint32_t b = static_cast<uint32_t>(h) << 16;
    for (uint32_t d : {0x7fffu, 0x8000u, 0x8001u}) out.push_back(FromBits(b | d));
  }
  return out;
}

TEST(OptimUpdateMath, RoundingMatchesCoreHalfAndBFloat16) {
  const Float16Rounding half;
  const BFloat16Rounding bf16;
  const ElemRounding<float> half_rt{ElemType::kFloat16}, bf16_rt{ElemType::kBFloat16},
      f32_rt{ElemType::kFloat32};
  const std::vector<float> samples = ConversionSamples();
  ASSERT_GT(samples.size(), 100000u);
  for (float x : samples) {
    const float want_half = static_cast<float>(Half(x));
    const float want_bf16 = static_cast<float>(BFloat16(x));
    ASSERT_EQ(Bits(half(x)), Bits(want_half)) << "float16 of bits 0x" << std::hex << Bits(x);
    ASSERT_EQ(Bits(bf16(x)), Bits(want_bf16)) << "bfloat16 of bits 0x" << std::hex << Bits(x);
    ASSERT_EQ(Bits(half_rt(x)), Bits(want_half))
        << "runtime float16 of bits 0x" << std::hex << Bits(x);
    ASSERT_EQ(Bits(bf16_rt(x)), Bits(want_bf16))
        << "runtime bfloat16 of bits 0x" << std::hex << Bits(x);
    ASSERT_EQ(Bits(f32_rt(x)), Bits(x));
    ASSERT_EQ(Bits(ExactRounding<float>{}(x)), Bits(x));
  }
  // The CPU loops pick the policy of the storage type.
  EXPECT_EQ(Bits(internal::RoundingFor<Half>()(1.0f / 3)),
            Bits(static_cast<float>(Half(1.0f / 3))));
  EXPECT_EQ(Bits(internal::RoundingFor<BFloat16>()(1.0f / 3)),
            Bits(static_cast<float>(BFloat16(1.0f / 3))));
  EXPECT_EQ(internal::RoundingFor<float>()(1.0f / 3), 1.0f / 3);
  EXPECT_EQ(internal::RoundingFor<double>()(1.0 / 3), 1.0 / 3);
  EXPECT_EQ(ElemRounding<double>{}(1.0 / 3), 1.0 / 3);
}

TEST(OptimUpdateMath, HelpersFollowTheStandardLibrary) {
  // Lerp's two branches (|w| < 0.5 and otherwise) and its exact endpoints.
  EXPECT_EQ(Lerp(1.0, 3.0, 0.25), 1.0 + 0.25 * (3.0 - 1.0));
  EXPECT_EQ(Lerp(1.0, 3.0, 0.75), 3.0 - (3.0 - 1.0) * (1.0 - 0.75));
  EXPECT_EQ(Lerp(0.1f, 0.7f, 1.0f), 0.7f);
  EXPECT_EQ(Lerp(0.1f, 0.7f, 0.0f), 0.1f);
  EXPECT_EQ(Lerp(0.1, 0.7, -0.25), 0.1 + -0.25 * (0.7 - 0.1));
  // Max is std::max (a NaN first argument is kept), Sqrt and Abs are the correctly rounded ones.
  EXPECT_EQ(Max(1.0f, 2.0f), 2.0f);
  EXPECT_EQ(Max(2.0, 1.0), 2.0);
  EXPECT_TRUE(std::isnan(Max(std::nanf(""), 1.0f)));
  EXPECT_EQ(Max(1.0f, std::nanf("")), 1.0f);
  EXPECT_EQ(Sqrt(2.0f), std::sqrt(2.0f));
  EXPECT_EQ(Sqrt(2.0), std::sqrt(2.0));
  EXPECT_EQ(Abs(-0.5f), 0.5f);
  EXPECT_EQ(Abs(-0.5), 0.5);
}

TEST(OptimUpdateMath, SgdElementKnownValues) {
  const ExactRounding<double> exact;
  // Plain SGD with weight decay: g' = g + 0.5 p; p = p - 0.1 g'.
  {
    const auto s = MakeSgdScalars<double>({.lr = 0.1, .weight_decay = 0.5});
    EXPECT_FALSE(s.use_momentum);
    EXPECT_DOUBLE_EQ(SgdUpdate(s, 1.0, 0.2, 0.0, exact).param, 0.93);
    EXPECT_DOUBLE_EQ(SgdUpdate(s, -2.0, 0.4, 0.0, exact).param, -1.94);
  }
  // Momentum: the first step stores the gradient, later steps buf = 0.9 buf + g.
  {
    const auto first = MakeSgdScalars<double>({.lr = 0.1, .momentum = 0.9, .first_step = true});
    const SgdElement<double> e1 = SgdUpdate(first, 1.0, 0.5, 123.0, exact);  // buf ignored
    EXPECT_EQ(e1.momentum_buffer, 0.5);
    EXPECT_DOUBLE_EQ(e1.param, 0.95);
    const auto later = MakeSgdScalars<double>({.lr = 0.1, .momentum = 0.9});
    const SgdElement<double> e2 = SgdUpdate(later, e1.param, 1.0, e1.momentum_buffer, exact);
    EXPECT_DOUBLE_EQ(e2.momentum_buffer, 1.45);
    EXPECT_DOUBLE_EQ(e2.param, 0.805);
  }
  // Nesterov uses g + momentum * buf; dampening scales the new gradient after the first step.
  {
    const auto nesterov = MakeSgdScalars<double>({.lr = 0.1, .momentum = 0.9, .nesterov = true});
    const SgdElement<double> e = SgdUpdate(nesterov, 0.905, 1.0, 0.5, exact);
    EXPECT_DOUBLE_EQ(e.momentum_buffer, 1.45);
    EXPECT_DOUBLE_EQ(e.param, 0.905 - 0.1 * (1.0 + 0.9 * 1.45));
    const auto damp = MakeSgdScalars<double>({.lr = 1.0, .momentum = 0.5, .dampening = 0.5});
    EXPECT_DOUBLE_EQ(SgdUpdate(damp, -2.0, 2.0, 2.0, exact).param, -4.0);
  }
  // Maximize negates the gradient before everything else.
  {
    const auto s = MakeSgdScalars<double>({.lr = 0.5, .weight_decay = 0.25, .maximize = true});
    EXPECT_DOUBLE_EQ(SgdUpdate(s, 1.0, 2.0, 0.0, exact).param, 1.0 - 0.5 * (-2.0 + 0.25 * 1.0));
  }
}

TEST(OptimUpdateMath, AdamElementKnownValues) {
  const ExactRounding<double> exact;
  // First Adam step from zero state: m = 0.05, v = 0.00025, bc1 = 0.1, bc2 = 0.001.
  AdamStepSpec spec{
      .lr = 0.1, .step_size = 0.1 / (1 - 0.9), .bias_correction2_sqrt = std::sqrt(1 - 0.999)};
  {
    const AdamElement<double> e =
        AdamUpdate(MakeAdamScalars<double>(spec), 1.0, 0.5, 0.0, 0.0, 0.0, exact);
    EXPECT_DOUBLE_EQ(e.exp_avg, (1 - 0.9) * 0.5);
    EXPECT_DOUBLE_EQ(e.exp_avg_sq, (1 - 0.999) * 0.5 * 0.5);
    EXPECT_NEAR(e.param, 1.0 - 0.05 / (0.5 + 1e-8), 1e-15);
  }
  // L2 weight decay adds wd * p to the gradient; amsgrad divides by the larger stored maximum.
  spec.weight_decay = 0.1;
  spec.amsgrad = true;
  {
    const double g = 0.5 + 0.1 * 1.0;
    const AdamElement<double> e =
        AdamUpdate(MakeAdamScalars<double>(spec), 1.0, 0.5, 0.0, 0.0, 0.04, exact);
    EXPECT_DOUBLE_EQ(e.exp_avg, (1 - 0.9) * g);
    EXPECT_DOUBLE_EQ(e.exp_avg_sq, (1 - 0.999) * g * g);
    EXPECT_EQ(e.max_exp_avg_sq, 0.04);
    EXPECT_NEAR(e.param, 1.0 - 1.0 * (0.1 * g) / (std::sqrt(0.04) / std::sqrt(0.001) + 1e-8),
                1e-15);
  }
  // AdamW: decoupled decay scales p by 1 - lr * wd and leaves the gradient alone.
  spec.decoupled_weight_decay = true;
  spec.amsgrad = false;
  {
    const AdamElement<double> e =
        AdamUpdate(MakeAdamScalars<double>(spec), 1.0, 0.5, 0.0, 0.0, 0.0, exact);
    EXPECT_DOUBLE_EQ(e.exp_avg, (1 - 0.9) * 0.5);
    EXPECT_NEAR(e.param, (1.0 - 0.1 * 0.1) - 0.05 / (0.5 + 1e-8), 1e-15);
  }
}

// The half-precision update, written as PyTorch's op sequence with every intermediate stored
// in a T tensor (fsdp::Half / fsdp::BFloat16 conversions of engine/core).
template <typename T>
float R(float x) {
  return static_cast<float>(static_cast<T>(x));
}

template <typename T, typename Round>
void CheckHalfPrecisionUpdatesAgainstCoreTypes(Round round) {
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::uniform_real_distribution<float> scale(-20.0f, 4.0f);
  const auto sample = [&] { return R<T>(dist(gen) * std::exp2(scale(gen))); };
  const SgdStepSpec sgd_spec{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  const auto sgd = MakeSgdScalars<float>(sgd_spec);
  AdamStepSpec adam_spec{.lr = 1e-3, .eps = 1e-6, .weight_decay = 0.02, .amsgrad = true};
  adam_spec.step_size = 1e-3 / (1 - 0.9 * 0.9);
  adam_spec.bias_correction2_sqrt = std::sqrt(1 - 0.999 * 0.999);
  const auto adam = MakeAdamScalars<float>(adam_spec);
  for (int i = 0; i < 20000; ++i) {
    const float p = sample(), g = sample(), buf = sample(), m = sample(), v = std::abs(sample());
    const float vmax = std::abs(sample());
    // SGD, momentum + nesterov + weight decay.
    float gs = R<T>(g + sgd.weight_decay * p);
    float b = R<T>(buf * sgd.momentum);
    b = R<T>(b + sgd.one_minus_dampening * gs);
    gs = R<T>(gs + sgd.momentum * b);
    const SgdElement<float> se = SgdUpdate(sgd, p, g, buf, round);
    ASSERT_EQ(Bits(R<T>(se.momentum_buffer)), Bits(b)) << i;
    ASSERT_EQ(Bits(R<T>(se.param)), Bits(R<T>(p + sgd.neg_lr * gs))) << i;
    // Adam, L2 weight decay + amsgrad.
    const float ga = R<T>(g + adam.weight_decay * p);
    const float mk =
        R<T>(std::abs(adam.one_minus_beta1) < 0.5f ? m + adam.one_minus_beta1 * (ga - m)
                                                   : ga - (ga - m) * (1.0f - adam.one_minus_beta1));
    float vk = R<T>(v * adam.beta2);
    vk = R<T>(vk + adam.one_minus_beta2 * ga * ga);
    const float vu = std::max(vmax, vk);
    float denom = R<T>(std::sqrt(vu));
    denom = R<T>(denom / adam.bias_correction2_sqrt);
    denom = R<T>(denom + adam.eps);
    const AdamElement<float> ae = AdamUpdate(adam, p, g, m, v, vmax, round);
    ASSERT_EQ(Bits(R<T>(ae.exp_avg)), Bits(mk)) << i;
    ASSERT_EQ(Bits(R<T>(ae.exp_avg_sq)), Bits(vk)) << i;
    ASSERT_EQ(Bits(R<T>(ae.max_exp_avg_sq)), Bits(vu)) << i;
    ASSERT_EQ(Bits(R<T>(ae.param)), Bits(R<T>(p + adam.neg_step_size * mk / denom))) << i;
  }
}

TEST(OptimUpdateMath, Float16UpdatesRoundLikeCoreHalf) {
  CheckHalfPrecisionUpdatesAgainstCoreTypes<Half>(Float16Rounding{});
  CheckHalfPrecisionUpdatesAgainstCoreTypes<Half>(ElemRounding<float>{ElemType::kFloat16});
}

TEST(OptimUpdateMath, BFloat16UpdatesRoundLikeCoreBFloat16) {
  CheckHalfPrecisionUpdatesAgainstCoreTypes<BFloat16>(BFloat16Rounding{});
  CheckHalfPrecisionUpdatesAgainstCoreTypes<BFloat16>(ElemRounding<float>{ElemType::kBFloat16});
}

// ---- The CUDA kernels' loop bodies (runtime dtype, raw storage) vs the optimizers ----------

std::vector<double> Values(std::mt19937& gen, double max_abs) {
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_real_distribution<double> exponent(-18.0, 0.0);
  std::vector<double> v(512);
  for (double& x : v) x = max_abs * unit(gen) * std::exp2(exponent(gen));
  return v;
}

// Elements whose bits differ, any two NaNs matching (their sign/payload is unspecified).
int64_t BitMismatches(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to_doubles(), vb = b.to_doubles();
  const auto* pa = static_cast<const uint8_t*>(a.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(b.data_ptr());
  const size_t es = a.element_size();
  int64_t n = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0 && !(std::isnan(va[i]) && std::isnan(vb[i])))
      ++n;
  }
  return n;
}

ElemType ElemOf(DType d) { return static_cast<ElemType>(static_cast<int>(d)); }

// Runs 4 steps of `optimizer` on a parameter and, on a copy, `raw_step(step, param, grad,
// state)` (the kernel loop body over every element); expects equal bits in the parameter and
// in each state tensor named in `state_keys` (created as zeros for the raw run).
void ExpectRawLoopMatches(
    DType dtype, const std::function<std::unique_ptr<Optimizer>(Tensor)>& make,
    const std::vector<std::string>& state_keys,
    const std::function<void(int, const Tensor&, const Tensor&, std::vector<Tensor>&)>& raw_step,
    const std::string& what) {
  SCOPED_TRACE(what + " " + DTypeName(dtype));
  std::mt19937 gen(99);
  const std::vector<double> init = Values(gen, 2.0);
  const Shape shape{static_cast<int64_t>(init.size())};
  Tensor p = Tensor::from_doubles(init, shape, dtype);
  p.set_requires_grad(true);
  Tensor raw = Tensor::from_doubles(init, shape, dtype);
  std::vector<Tensor> state;
  for (size_t k = 0; k < state_keys.size(); ++k) state.push_back(Tensor::zeros(shape, dtype));
  std::unique_ptr<Optimizer> optimizer = make(p);
  for (int step = 0; step < 4; ++step) {
    const Tensor g = Tensor::from_doubles(Values(gen, 1.0 + step), shape, dtype);
    p.set_grad(g);
    optimizer->step();
    raw_step(step, raw, g, state);
    ASSERT_EQ(BitMismatches(raw, p), 0) << "parameter after step " << step + 1;
    for (size_t k = 0; k < state_keys.size(); ++k) {
      ASSERT_EQ(BitMismatches(state[k], optimizer->state(p).at(state_keys[k])), 0)
          << state_keys[k] << " after step " << step + 1;
    }
  }
}

template <typename Fn>
void WithAcc(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat64) {
    fn(double{});
  } else {
    fn(float{});
  }
}

const DType kAllFloating[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

TEST(OptimUpdateMath, SgdKernelLoopBodyMatchesTheOptimizer) {
  const std::vector<SGDOptions> configs = {
      {.lr = 0.1},
      {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true},
      {.lr = 0.05, .momentum = 0.5, .dampening = 0.25, .maximize = true}};
  for (DType dtype : kAllFloating) {
    for (const SGDOptions& o : configs) {
      const bool momentum = o.momentum != 0.0;
      ExpectRawLoopMatches(
          dtype, [&](Tensor p) { return std::make_unique<SGD>(std::vector<Tensor>{p}, o); },
          momentum ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{},
          [&](int step, const Tensor& param, const Tensor& grad, std::vector<Tensor>& state) {
            const SgdStepSpec spec{.lr = o.lr,
                                   .momentum = o.momentum,
                                   .dampening = o.dampening,
                                   .weight_decay = o.weight_decay,
                                   .nesterov = o.nesterov,
                                   .maximize = o.maximize,
                                   .first_step = step == 0};
            WithAcc(dtype, [&](auto acc) {
              using A = decltype(acc);
              const SgdScalars<A> s = MakeSgdScalars<A>(spec);
              void* buf = momentum ? state[0].data_ptr() : nullptr;
              for (int64_t i = 0; i < param.numel(); ++i) {
                SgdStepAt(s, param.data_ptr(), grad.data_ptr(), buf, ElemOf(dtype), i);
              }
            });
          },
          "SGD momentum=" + std::to_string(o.momentum));
    }
  }
}

TEST(OptimUpdateMath, AdamKernelLoopBodyMatchesTheOptimizer) {
  struct Config {
    AdamOptions o;
    bool decoupled;
  };
  const std::vector<Config> configs = {{{.lr = 1e-2}, false},
                                       {{.lr = 1e-2,
                                         .beta1 = 0.8,
                                         .beta2 = 0.95,
                                         .eps = 1e-6,
                                         .weight_decay = 0.1,
                                         .amsgrad = true,
                                         .maximize = true},
                                        false},
                                       {{.lr = 1e-2, .weight_decay = 0.05, .amsgrad = true}, true}};
  for (DType dtype : kAllFloating) {
    for (const Config& c : configs) {
      const AdamOptions& o = c.o;
      std::vector<std::string> keys = {"exp_avg", "exp_avg_sq"};
      if (o.amsgrad) keys.push_back("max_exp_avg_sq");
      ExpectRawLoopMatches(
          dtype,
          [&](Tensor p) -> std::unique_ptr<Optimizer> {
            if (!c.decoupled) return std::make_unique<Adam>(std::vector<Tensor>{p}, o);
            return std::make_unique<AdamW>(
                std::vector<Tensor>{p},
                AdamWOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad, o.maximize});
          },
          keys,
          [&](int step, const Tensor& param, const Tensor& grad, std::vector<Tensor>& state) {
            // Adam::step's scalars from its float32 step counter.
            const double t = static_cast<float>(step + 1);
            AdamStepSpec spec{.lr = o.lr,
                              .beta1 = o.beta1,
                              .beta2 = o.beta2,
                              .eps = o.eps,
                              .weight_decay = o.weight_decay,
                              .step_size = o.lr / (1.0 - std::pow(o.beta1, t)),
                              .bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t)),
                              .decoupled_weight_decay = c.decoupled,
                              .amsgrad = o.amsgrad,
                              .maximize = o.maximize};
            WithAcc(dtype, [&](auto acc) {
              using A = decltype(acc);
              const AdamScalars<A> s = MakeAdamScalars<A>(spec);
              void* vmax = o.amsgrad ? state[2].data_ptr() : nullptr;
              for (int64_t i = 0; i < param.numel(); ++i) {
                AdamStepAt(s, param.data_ptr(), grad.data_ptr(), state[0].data_ptr(),
                           state[1].data_ptr(), vmax, ElemOf(dtype), i);
              }
            });
          },
          std::string(c.decoupled ? "AdamW" : "Adam") + (o.amsgrad ? " amsgrad" : ""));
    }
  }
}

}  // namespace
}  // namespace fsdp::optim::math
