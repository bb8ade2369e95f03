#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/autograd/variable.h"
#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
#include "engine/optim/adam.h"
#include "engine/optim/lr_scheduler.h"
#include "engine/optim/sgd.h"

namespace fsdp::optim {
namespace {

Tensor Param(const std::vector<double>& values, DType dtype = DType::kFloat64) {
  Tensor p = Tensor::from_doubles(values, {static_cast<int64_t>(values.size())}, dtype);
  p.set_requires_grad(true);
  return p;
}

void SetGrad(const Tensor& p, const std::vector<double>& values) {
  p.set_grad(Tensor::from_doubles(values, p.sizes(), p.dtype()));
}

void ExpectValues(const Tensor& t, const std::vector<double>& expected, double tol = 1e-12) {
  std::vector<double> got = t.to_doubles();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "index " << i;
}

TEST(OptimSGD, PlainAndWeightDecay) {
  Tensor p = Param({1.0, -2.0});
  SGD sgd({p}, {.lr = 0.1, .weight_decay = 0.5});
  SetGrad(p, {0.2, 0.4});
  const uint64_t version = p.version();
  sgd.step();
  // g' = g + 0.5 p = [0.7, -0.6]; p = p - 0.1 g'.
  ExpectValues(p, {0.93, -1.94});
  EXPECT_GT(p.version(), version);
  EXPECT_FALSE(sgd.state(p).contains("momentum_buffer"));
}

TEST(OptimSGD, MomentumTwoSteps) {
  Tensor p = Param({1.0, 2.0});
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
  SetGrad(p, {0.5, -1.0});
  sgd.step();
  // First step: buf = grad.
  ExpectValues(p, {0.95, 2.1});
  ExpectValues(sgd.state(p).at("momentum_buffer"), {0.5, -1.0});
  SetGrad(p, {1.0, 1.0});
  sgd.step();
  // buf = 0.9 buf + g = [1.45, 0.1].
  ExpectValues(sgd.state(p).at("momentum_buffer"), {1.45, 0.1});
  ExpectValues(p, {0.805, 2.09});
}

TEST(OptimSGD, NesterovAndDampening) {
  Tensor p = Param({1.0, 2.0});
  SGD nesterov({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  SetGrad(p, {0.5, -1.0});
  nesterov.step();
  ExpectValues(p, {0.905, 2.19});  // g + 0.9 buf = 1.9 g
  SetGrad(p, {1.0, 1.0});
  nesterov.step();
  ExpectValues(p, {0.6745, 2.081});  // buf = [1.45, 0.1]; g + 0.9 buf = [2.305, 1.09]

  Tensor q = Param({0.0});
  SGD damp({q}, {.lr = 1.0, .momentum = 0.5, .dampening = 0.5});
  SetGrad(q, {2.0});
  damp.step();  // buf = 2 (no dampening on the first step)
  ExpectValues(q, {-2.0});
  SetGrad(q, {2.0});
  damp.step();  // buf = 0.5 * 2 + 0.5 * 2 = 2
  ExpectValues(q, {-4.0});

  EXPECT_THROW(SGD({Param({1.0})}, {.momentum = 0.0, .nesterov = true}), Error);
  EXPECT_THROW(SGD({Param({1.0})}, {.lr = -1.0}), Error);
}

TEST(OptimSGD, MaximizeNegatesGradient) {
  Tensor p = Param({1.0});
  SGD sgd({p}, {.lr = 0.5, .maximize = true});
  SetGrad(p, {2.0});
  sgd.step();
  ExpectValues(p, {2.0});
}

// The PyTorch algorithm written out in double for one element.
struct AdamRef {
  double p, m = 0, v = 0, vmax = 0;
  int step = 0;
  void update(double g, double lr, double b1, double b2, double eps, double wd, bool decoupled,
              bool amsgrad = false) {
    ++step;
    if (wd != 0) {
      if (decoupled) {
        p *= 1 - lr * wd;
      } else {
        g += wd * p;
      }
    }
    m = m + (1 - b1) * (g - m);
    v = v * b2 + (1 - b2) * g * g;
    const double bc1 = 1 - std::pow(b1, step);
    const double bc2 = 1 - std::pow(b2, step);
    double vu = v;
    if (amsgrad) {
      vmax = std::max(vmax, v);
      vu = vmax;
    }
    const double denom = std::sqrt(vu) / std::sqrt(bc2) + eps;
    p -= (lr / bc1) * m / denom;
  }
};

TEST(OptimAdam, OneAndTwoStepsByHand) {
  Tensor p = Param({1.0});
  Adam adam({p}, {.lr = 0.1});
  SetGrad(p, {0.5});
  adam.step();
  // m = 0.05, v = 0.00025, bc1 = 0.1, bc2 = 0.001: denom = 0.5 + 1e-8, step_size = 1.
  ExpectValues(p, {1.0 - 0.05 / (0.5 + 1e-8)});
  ExpectValues(adam.state(p).at("exp_avg"), {0.05});
  ExpectValues(adam.state(p).at("exp_avg_sq"), {0.00025});
  EXPECT_EQ(adam.state(p).at("step").item(), 1.0);
  EXPECT_EQ(adam.state(p).at("step").dtype(), DType::kFloat32);
  SetGrad(p, {-0.25});
  adam.step();
  // m = 0.02, v = 0.00031225, bc1 = 0.19, bc2 = 0.001999.
  const double p1 = 1.0 - 0.05 / (0.5 + 1e-8);
  const double p2 = p1 - (0.1 / 0.19) * 0.02 / (std::sqrt(0.00031225) / std::sqrt(0.001999) + 1e-8);
  ExpectValues(p, {p2});
  ExpectValues(adam.state(p).at("exp_avg"), {0.02});
  ExpectValues(adam.state(p).at("exp_avg_sq"), {0.00031225});
}

TEST(OptimAdam, L2WeightDecayAndAmsgradMatchReference) {
  Tensor p = Param({0.3, -0.7});
  Adam adam(
      {p},
      {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.1, .amsgrad = true});
  AdamRef r0{0.3}, r1{-0.7};
  const std::vector<std::vector<double>> grads = {{1.0, -0.5}, {0.01, 0.2}, {-0.3, 0.001}};
  for (const auto& g : grads) {
    SetGrad(p, g);
    adam.step();
    r0.update(g[0], 0.01, 0.8, 0.9, 1e-6, 0.1, false, true);
    r1.update(g[1], 0.01, 0.8, 0.9, 1e-6, 0.1, false, true);
  }
  ExpectValues(p, {r0.p, r1.p});
  ExpectValues(adam.state(p).at("max_exp_avg_sq"), {r0.vmax, r1.vmax});
}

TEST(OptimAdamW, DecoupledDecayTwoSteps) {
  Tensor p = Param({1.0, 2.0});
  AdamW adamw({p}, {.lr = 0.1});  // weight_decay defaults to 1e-2
  EXPECT_EQ(adamw.options().weight_decay, 1e-2);
  AdamRef r0{1.0}, r1{2.0};
  SetGrad(p, {0.5, 0.1});
  adamw.step();
  r0.update(0.5, 0.1, 0.9, 0.999, 1e-8, 1e-2, true);
  r1.update(0.1, 0.1, 0.9, 0.999, 1e-8, 1e-2, true);
  // Step one by hand: p = 1 * (1 - 1e-3) - 0.05 / (0.5 + 1e-8).
  ExpectValues(p, {0.999 - 0.05 / (0.5 + 1e-8), r1.p});
  SetGrad(p, {-0.25, 0.3});
  adamw.step();
  r0.update(-0.25, 0.1, 0.9, 0.999, 1e-8, 1e-2, true);
  r1.update(0.3, 0.1, 0.9, 0.999, 1e-8, 1e-2, true);
  ExpectValues(p, {r0.p, r1.p});
}

TEST(OptimAdam, Float32FollowsFloat64WithinRounding) {
  Tensor p32 = Param({0.1, -0.2, 0.3}, DType::kFloat32);
  Tensor p64 = Param({0.1, -0.2, 0.3}, DType::kFloat64);
  AdamW a32({p32}, {.lr = 1e-2});
  AdamW a64({p64}, {.lr = 1e-2});
  for (int i = 0; i < 5; ++i) {
    const std::vector<double> g = {0.5 - i * 0.1, 0.01 * i, -0.3};
    SetGrad(p32, g);
    SetGrad(p64, g);
    a32.step();
    a64.step();
  }
  ExpectValues(p32, p64.to_doubles(), 1e-6);
  EXPECT_EQ(p32.dtype(), DType::kFloat32);
  EXPECT_EQ(a32.state(p32).at("exp_avg").dtype(), DType::kFloat32);
}

TEST(OptimAdam, HalfPrecisionParametersRoundPerOp) {
  Tensor p = Param({0.5, -1.0}, DType::kBFloat16);
  Adam adam({p}, {.lr = 0.1});
  SetGrad(p, {1.0, -1.0});
  adam.step();
  // m = 0.1 g, v = 0.001 g², denom ≈ 1: p -= 0.1 * sign(g), within bfloat16 rounding.
  ExpectValues(p, {0.4, -0.9}, 4e-3);
  EXPECT_EQ(adam.state(p).at("exp_avg").dtype(), DType::kBFloat16);
}

TEST(OptimBase, SkipsMissingGradsZeroGradAndChecks) {
  Tensor a = Param({1.0});
  Tensor b = Param({2.0});
  SGD sgd({a, b}, {.lr = 1.0, .momentum = 0.9});
  SetGrad(a, {1.0});
  sgd.step();
  ExpectValues(a, {0.0});
  ExpectValues(b, {2.0});
  EXPECT_TRUE(sgd.has_state(a));
  EXPECT_FALSE(sgd.has_state(b));
  EXPECT_THROW(sgd.state(b), Error);
  sgd.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(a.grad().defined());
  ExpectValues(a.grad(), {0.0});
  sgd.zero_grad();
  EXPECT_FALSE(a.grad().defined());

  EXPECT_THROW(SGD(std::vector<Tensor>{}), Error);
  EXPECT_THROW(sgd.add_param_group({a}), Error);  // already in a group
  Tensor c = Param({3.0});
  sgd.add_param_group({c}, 0.5);
  ASSERT_EQ(sgd.param_groups().size(), 2u);
  EXPECT_EQ(sgd.param_groups()[1].lr, 0.5);
  SetGrad(c, {1.0});
  sgd.step();
  ExpectValues(c, {2.5});

  Adam named(std::vector<std::pair<std::string, Tensor>>{{"w", Param({1.0})}});
  EXPECT_EQ(named.param_groups()[0].names, (std::vector<std::string>{"w"}));
  EXPECT_EQ(named.name(), "Adam");
}

TEST(OptimLRScheduler, StepLRSchedule) {
  Tensor p = Param({1.0});
  SGD sgd({p}, {.lr = 1.0});
  StepLR sched(sgd, /*step_size=*/2, /*gamma=*/0.5);
  EXPECT_EQ(sched.last_epoch(), 0);
  EXPECT_EQ(sched.get_last_lr(), (std::vector<double>{1.0}));
  std::vector<double> lrs;
  for (int i = 0; i < 6; ++i) {
    sched.step();
    lrs.push_back(sgd.param_groups()[0].lr);
  }
  EXPECT_EQ(lrs, (std::vector<double>{1.0, 0.5, 0.5, 0.25, 0.25, 0.125}));
  EXPECT_EQ(sched.get_last_lr(), (std::vector<double>{0.125}));
  EXPECT_EQ(sched.base_lrs(), (std::vector<double>{1.0}));
  EXPECT_EQ(*sgd.param_groups()[0].initial_lr, 1.0);
  EXPECT_THROW(StepLR(sgd, 0), Error);
}

// test_post_acc_grad_hook_optim_parity's core: one AdamW (+StepLR) per parameter gives
// bitwise the same parameters as one AdamW over all of them.
TEST(OptimAdamW, PerParameterOptimizersMatchOneOptimizer) {
  std::vector<Tensor> ref = {Param({0.1, 0.2, 0.3}, DType::kFloat32),
                             Param({-1.0}, DType::kFloat32)};
  std::vector<Tensor> per = {Param({0.1, 0.2, 0.3}, DType::kFloat32),
                             Param({-1.0}, DType::kFloat32)};
  AdamW ref_optim(ref, {.lr = 1e-2});
  StepLR ref_sched(ref_optim, 5);
  std::vector<std::unique_ptr<AdamW>> optims;
  std::vector<std::unique_ptr<StepLR>> scheds;
  for (auto& p : per) {
    optims.push_back(std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 1e-2}));
    scheds.push_back(std::make_unique<StepLR>(*optims.back(), 5));
  }
  for (int it = 0; it < 10; ++it) {
    for (size_t i = 0; i < ref.size(); ++i) {
      std::vector<double> g(static_cast<size_t>(ref[i].numel()), 0.1 * (it + 1) * (i + 1));
      SetGrad(ref[i], g);
      SetGrad(per[i], g);
    }
    ref_optim.step();
    ref_optim.zero_grad();
    ref_sched.step();
    for (size_t i = 0; i < per.size(); ++i) {
      optims[i]->step();
      optims[i]->zero_grad();
      scheds[i]->step();
    }
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(ref[i].to_doubles(), per[i].to_doubles());
  }
  EXPECT_NEAR(ref_optim.param_groups()[0].lr, 1e-2 * 0.1 * 0.1, 1e-18);
}

// GPU: parameters, grads and state live on the device; the CUDA update kernels match the CPU
// results exactly.
TEST(OptimAdamWGpu, CudaParametersMatchCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  Tensor cpu = Param({0.1, -0.2, 0.3}, DType::kFloat32);
  Tensor gpu = cpu.detach().clone().to(Device::CUDA(0));
  gpu.set_requires_grad(true);
  AdamW cpu_optim({cpu}, {.lr = 1e-2});
  AdamW gpu_optim({gpu}, {.lr = 1e-2});
  SGD cpu_sgd({cpu}, {.lr = 0.1, .momentum = 0.9});
  SGD gpu_sgd({gpu}, {.lr = 0.1, .momentum = 0.9});
  for (int i = 0; i < 3; ++i) {
    const std::vector<double> g = {0.5, -0.1 * i, 0.25};
    SetGrad(cpu, g);
    gpu.set_grad(Tensor::from_doubles(g, {3}, DType::kFloat32).to(Device::CUDA(0)));
    cpu_optim.step();
    gpu_optim.step();
    cpu_sgd.step();
    gpu_sgd.step();
  }
  EXPECT_TRUE(gpu.device().is_cuda());
  EXPECT_TRUE(gpu_optim.state(gpu).at("exp_avg").device().is_cuda());
  EXPECT_EQ(gpu.to_doubles(), cpu.to_doubles());
  EXPECT_EQ(gpu_sgd.state(gpu).at("momentum_buffer").to_doubles(),
            cpu_sgd.state(cpu).at("momentum_buffer").to_doubles());
}


// ---- Optimizer steps on the CUDA device vs the CPU loops, bit for bit ----------------------

// The raw bytes of `t` (copied to the host).
std::vector<uint8_t> Bytes(const Tensor& t) {
  const Tensor host = t.to(Device::CPU());
  std::vector<uint8_t> out(host.nbytes());
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size());
  return out;
}

// Number of elements of `got` whose bits differ from `want`'s, where any two NaNs match: IEEE
// leaves a NaN's sign and payload unspecified (the GPU writes its canonical NaN, x86 its
// default NaN with the sign bit set), e.g. float16 Adam with eps = 1e-8 dividing 0 by 0.
int64_t BitMismatches(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.sizes(), want.sizes());
  const std::vector<uint8_t> a = Bytes(got), b = Bytes(want);
  if (a.size() != b.size()) return -1;
  const std::vector<double> va = got.to_doubles(), vb = want.to_doubles();
  const size_t es = got.element_size();
  int64_t mismatches = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::memcmp(&a[i * es], &b[i * es], es) == 0) continue;
    if (std::isnan(va[i]) && std::isnan(vb[i])) continue;
    ++mismatches;
  }
  return mismatches;
}

// 1000 values (several CUDA blocks) spread over many magnitudes, float16 subnormals included.
std::vector<double> Values(std::mt19937& gen, double max_abs) {
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_real_distribution<double> exponent(-18.0, 0.0);
  std::vector<double> v(1000);
  for (double& x : v) x = max_abs * unit(gen) * std::exp2(exponent(gen));
  return v;
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(Tensor)>;

// Runs `steps` updates of make(param) on a CPU parameter and on a cuda:0 copy, with the same
// grads, and expects the parameters and every state tensor to be equal bit for bit (NaNs
// match any NaN, see BitMismatches).
void ExpectCudaStepsMatchCpu(DType dtype, const MakeOptimizer& make, const std::string& what,
                             int steps = 4) {
  SCOPED_TRACE(what + " " + DTypeName(dtype));
  std::mt19937 gen(42);
  const std::vector<double> init = Values(gen, 2.0);
  Tensor cpu = Param(init, dtype);
  Tensor gpu = Tensor::from_doubles(init, cpu.sizes(), dtype).to(Device::CUDA(0));
  gpu.set_requires_grad(true);
  std::unique_ptr<Optimizer> cpu_optim = make(cpu);
  std::unique_ptr<Optimizer> gpu_optim = make(gpu);
  for (int step = 0; step < steps; ++step) {
    const std::vector<double> g = Values(gen, 1.0 + step);
    SetGrad(cpu, g);
    gpu.set_grad(Tensor::from_doubles(g, cpu.sizes(), dtype).to(Device::CUDA(0)));
    const uint64_t version = gpu.version();
    cpu_optim->step();
    gpu_optim->step();
    EXPECT_GT(gpu.version(), version);
    ASSERT_EQ(BitMismatches(gpu, cpu), 0) << "parameter after step " << step + 1;
    const auto& cpu_state = cpu_optim->state(cpu);
    const auto& gpu_state = gpu_optim->state(gpu);
    ASSERT_EQ(gpu_state.keys(), cpu_state.keys());
    for (const std::string& key : cpu_state.keys()) {
      const Tensor& gs = gpu_state.at(key);
      EXPECT_EQ(gs.device(), key == "step" ? Device::CPU() : Device::CUDA(0)) << key;
      EXPECT_EQ(gs.dtype(), cpu_state.at(key).dtype()) << key;
      ASSERT_EQ(BitMismatches(gs, cpu_state.at(key)), 0) << key << " after step " << step + 1;
    }
  }
  EXPECT_TRUE(gpu.device().is_cuda());
}

const DType kFloatingDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                 DType::kBFloat16};

TEST(OptimStepGpu, SgdMatchesCpuBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (DType dtype : kFloatingDTypes) {
    ExpectCudaStepsMatchCpu(dtype, [](Tensor p) {
      return std::make_unique<SGD>(std::vector<Tensor>{p}, SGDOptions{.lr = 0.1});
    }, "SGD plain");
    ExpectCudaStepsMatchCpu(dtype, [](Tensor p) {
      return std::make_unique<SGD>(std::vector<Tensor>{p},
                                   SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01,
                                              .nesterov = true});
    }, "SGD momentum+nesterov+weight_decay");
    ExpectCudaStepsMatchCpu(dtype, [](Tensor p) {
      return std::make_unique<SGD>(std::vector<Tensor>{p},
                                   SGDOptions{.lr = 0.05, .momentum = 0.5, .dampening = 0.25,
                                              .maximize = true});
    }, "SGD maximize+dampening");
  }
}

TEST(OptimStepGpu, AdamAndAdamWMatchCpuBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (DType dtype : kFloatingDTypes) {
    ExpectCudaStepsMatchCpu(dtype, [](Tensor p) {
      return std::make_unique<Adam>(std::vector<Tensor>{p}, AdamOptions{.lr = 1e-2});
    }, "Adam");
    ExpectCudaStepsMatchCpu(dtype, [](Tensor p) {
      return std::make_unique<Adam>(std::vector<Tensor>{p},
                                    AdamOptions{.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95,
                                                .eps = 1e-6, .weight_decay = 0.1,
                                                .amsgrad = true, .maximize = true});
    }, "Adam amsgrad+L2+maximize");
    ExpectCudaStepsMatchCpu(dtype, [](Tensor p) {
      return std::make_unique<AdamW>(std::vector<Tensor>{p},
                                     AdamWOptions{.lr = 1e-2, .weight_decay = 0.05,
                                                  .amsgrad = true});
    }, "AdamW amsgrad");
  }
}

// The kernels run on the thread's current stream: under a CudaStreamGuard the results are
// there once that stream is synchronised.
TEST(OptimStepGpu, StepsRunOnTheCurrentStream) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  CudaStream stream(Device::CUDA(0));
  CudaStreamGuard guard(stream.ref());
  ExpectCudaStepsMatchCpu(DType::kFloat32, [](Tensor p) {
    return std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 1e-2});
  }, "AdamW on a side stream", /*steps=*/2);
  stream.Synchronize();
}

// A grad on another device than its CUDA parameter is a clear error naming both devices.
TEST(OptimStepGpu, GradOnAnotherDeviceIsRejected) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  Tensor p = Tensor::zeros({3}, DType::kFloat32, Device::CUDA(0));
  p.set_requires_grad(true);
  // set_grad refuses the mismatch, so place the grad the way a buggy hook could.
  autograd::materialize_autograd_meta(p).grad = Tensor::ones({3}, DType::kFloat32);
  SGD sgd(std::vector<std::pair<std::string, Tensor>>{{"layer.weight", p}}, SGDOptions{.lr = 0.1});
  try {
    sgd.step();
    FAIL() << "expected an fsdp::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  }
  EXPECT_EQ(p.to_doubles(), (std::vector<double>{0.0, 0.0, 0.0}));
}

}  // namespace
}  // namespace fsdp::optim
