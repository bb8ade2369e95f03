// The per-element update math of the optimizers: the one source of the SGD and Adam/AdamW
// formulas, called by the CPU loops (sgd.cc, adam.cc) and by the CUDA kernels
// (optim_cuda.cu), so both devices compute bit-identical results.
//
// Each update is PyTorch's sequence of single-tensor ops (`_single_tensor_sgd`,
// `_single_tensor_adam`); every op's result is rounded to the parameter's storage dtype while
// computing in the accumulation type A (OpMath<T> of engine/core/dtype.h, ATen's opmath:
// double for float64, float for float32, float16 and bfloat16). The rounding is a template
// argument `Round` (a callable A -> A):
//   ExactRounding<A>   float32 storage with float math, float64 with double math (identity);
//   Float16Rounding    float -> float16 -> float, through the bit conversions of
//   BFloat16Rounding   engine/ops/cuda/numerics.h (bit-for-bit those of engine/core/dtype.cc);
//   ElemRounding<A>    the storage dtype chosen at run time (the CUDA kernels, which take the
//                      dtype as a runtime switch like the ops kernels).
// The element functions return the values to store; the caller's store rounds them once more
// to the storage dtype (the final op of each update writes straight into the tensor).
// SgdStepAt/AdamStepAt are the CUDA kernels' loop bodies on raw storage with a runtime dtype;
// the host tests run them too and compare with the optimizers' CPU loops.
//
// Device/host identity: every op here is a single IEEE operation (+, -, *, /, sqrt, compare)
// on A, which both g++ (x86-64 SSE, no contraction under -std=c++20) and nvcc (add.rn/mul.rn,
// div.rn and sqrt.rn with the default -prec-div/-prec-sqrt) round correctly, PROVIDED nvcc
// does not fuse a*b+c into an FMA: optim_cuda.cu is compiled with -fmad=false (see there).
// Thread-safety: value types and pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/ops/cuda/host_device.h"
#include "engine/ops/cuda/numerics.h"

namespace fsdp::optim::math {

using ops::kernels::cuda::ElemType;

// ---- Host/device scalar helpers -------------------------------------------------------------

// For A = float or double. On the device CUDA's float/double overloads of sqrt are correctly
// rounded (nvcc's default -prec-sqrt=true); Abs compares with 0.5 only (lerp's branch).
template <typename A>
FSDP_HOST_DEVICE inline A Sqrt(A x) {
#ifdef __CUDA_ARCH__
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}
template <typename A>
FSDP_HOST_DEVICE inline A Abs(A x) {
  return x < A(0) ? -x : x;
}
// std::max's semantics (returns `a` unless a < b, so a NaN in `a` is kept), not fmax's.
template <typename A>
FSDP_HOST_DEVICE inline A Max(A a, A b) {
  return a < b ? b : a;
}

// at::native lerp (scalar weight): self + w * (end - self) for |w| < 0.5, else
// end - (end - self) * (1 - w).
template <typename A>
FSDP_HOST_DEVICE inline A Lerp(A self, A end, A weight) {
  return Abs(weight) < A(0.5) ? self + weight * (end - self) : end - (end - self) * (A(1) - weight);
}

// ---- Storage rounding -------------------------------------------------------------------------

// The storage dtype is the accumulation type itself (float32 with float, float64 with double).
template <typename A>
struct ExactRounding {
  FSDP_HOST_DEVICE A operator()(A x) const { return x; }
};

// float16 storage, float math: round to nearest even through the float16 bits.
struct Float16Rounding {
  FSDP_HOST_DEVICE float operator()(float x) const {
    return ops::kernels::cuda::FloatFromHalfBits(ops::kernels::cuda::HalfBitsFromFloat(x));
  }
};

// bfloat16 storage, float math.
struct BFloat16Rounding {
  FSDP_HOST_DEVICE float operator()(float x) const {
    return ops::kernels::cuda::FloatFromBFloat16Bits(ops::kernels::cuda::BFloat16BitsFromFloat(x));
  }
};

// The storage dtype as a runtime value. With double math the storage is float64 (exact);
// with float math it is float32, float16 or bfloat16.
template <typename A>
struct ElemRounding {
  ElemType storage = ElemType::kFloat64;
  FSDP_HOST_DEVICE A operator()(A x) const { return x; }
};
template <>
struct ElemRounding<float> {
  ElemType storage = ElemType::kFloat32;
  FSDP_HOST_DEVICE float operator()(float x) const {
    switch (storage) {
      case ElemType::kFloat16:
        return Float16Rounding{}(x);
      case ElemType::kBFloat16:
        return BFloat16Rounding{}(x);
      default:
        return x;
    }
  }
};

// ---- SGD --------------------------------------------------------------------------------------

// One SGD step of one parameter, as given by the optimizer (double precision options).
struct SgdStepSpec {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
  bool first_step = false;  // the momentum buffer is created by this step (buf = g)
};

// The scalars of an SgdStepSpec in the accumulation type (each rounded once from double, like
// the Python scalars PyTorch passes to its ops); the flags test the double values.
template <typename A>
struct SgdScalars {
  A weight_decay = A(0);
  A momentum = A(0);
  A one_minus_dampening = A(1);
  A neg_lr = A(0);
  bool maximize = false;
  bool use_weight_decay = false;
  bool use_momentum = false;
  bool nesterov = false;
  bool first_step = false;
};

template <typename A>
SgdScalars<A> MakeSgdScalars(const SgdStepSpec& spec) {
  SgdScalars<A> s;
  s.weight_decay = static_cast<A>(spec.weight_decay);
  s.momentum = static_cast<A>(spec.momentum);
  s.one_minus_dampening = static_cast<A>(1.0 - spec.dampening);
  s.neg_lr = static_cast<A>(-spec.lr);
  s.maximize = spec.maximize;
  s.use_weight_decay = spec.weight_decay != 0.0;
  s.use_momentum = spec.momentum != 0.0;
  s.nesterov = spec.nesterov;
  s.first_step = spec.first_step;
  return s;
}

// The values to store for one element.
template <typename A>
struct SgdElement {
  A param;
  A momentum_buffer;  // meaningful only with momentum
};

// `_single_tensor_sgd` for one element: p, g and buf are the stored values (buf is ignored
// without momentum and on the first step).
//   g = -g (maximize);  g = g + weight_decay * p
//   buf = g (first step) | buf = buf * momentum;  buf = buf + (1 - dampening) * g
//   g = g + momentum * buf (nesterov) | g = buf;  p = p + (-lr) * g
template <typename A, typename Round>
FSDP_HOST_DEVICE inline SgdElement<A> SgdUpdate(const SgdScalars<A>& s, A p, A g, A buf,
                                                Round round) {
  if (s.maximize) g = -g;
  if (s.use_weight_decay) g = round(g + s.weight_decay * p);
  A b = buf;
  if (s.use_momentum) {
    if (s.first_step) {
      b = g;
    } else {
      b = round(buf * s.momentum);
      b = round(b + s.one_minus_dampening * g);
    }
    g = s.nesterov ? round(g + s.momentum * b) : b;
  }
  return SgdElement<A>{p + s.neg_lr * g, b};
}

// ---- Adam / AdamW -----------------------------------------------------------------------------

// One Adam(W) step of one parameter. step_size = lr / bias_correction1 and
// bias_correction2_sqrt = sqrt(1 - beta2^step) are computed in double by the optimizer from
// its float32 step counter.
struct AdamStepSpec {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double step_size = 0.0;
  double bias_correction2_sqrt = 1.0;
  bool decoupled_weight_decay = false;  // AdamW: p = p * (1 - lr * weight_decay)
  bool amsgrad = false;
  bool maximize = false;
};

template <typename A>
struct AdamScalars {
  A weight_decay = A(0);
  A decay_factor = A(1);  // 1 - lr * weight_decay
  A one_minus_beta1 = A(0);
  A beta2 = A(0);
  A one_minus_beta2 = A(0);
  A bias_correction2_sqrt = A(1);
  A eps = A(0);
  A neg_step_size = A(0);
  bool maximize = false;
  bool use_weight_decay = false;
  bool decoupled = false;
  bool amsgrad = false;
};

template <typename A>
AdamScalars<A> MakeAdamScalars(const AdamStepSpec& spec) {
  AdamScalars<A> s;
  s.weight_decay = static_cast<A>(spec.weight_decay);
  s.decay_factor = static_cast<A>(1.0 - spec.lr * spec.weight_decay);
  s.one_minus_beta1 = static_cast<A>(1.0 - spec.beta1);
  s.beta2 = static_cast<A>(spec.beta2);
  s.one_minus_beta2 = static_cast<A>(1.0 - spec.beta2);
  s.bias_correction2_sqrt = static_cast<A>(spec.bias_correction2_sqrt);
  s.eps = static_cast<A>(spec.eps);
  s.neg_step_size = static_cast<A>(-spec.step_size);
  s.maximize = spec.maximize;
  s.use_weight_decay = spec.weight_decay != 0.0;
  s.decoupled = spec.decoupled_weight_decay;
  s.amsgrad = spec.amsgrad;
  return s;
}

template <typename A>
struct AdamElement {
  A param;
  A exp_avg;
  A exp_avg_sq;
  A max_exp_avg_sq;  // meaningful only with amsgrad
};

// `_single_tensor_adam` for one element: p, g, m (exp_avg), v (exp_avg_sq) and vmax
// (max_exp_avg_sq, ignored without amsgrad) are the stored values.
//   g = -g (maximize);  AdamW: p = p * (1 - lr * wd)  |  Adam: g = g + wd * p
//   m = lerp(m, g, 1 - beta1);  v = v * beta2;  v = v + (1 - beta2) * g * g
//   vmax = max(vmax, v) (amsgrad, used instead of v below)
//   denom = sqrt(v);  denom = denom / sqrt(bias_correction2);  denom = denom + eps
//   p = p + (-step_size) * m / denom
template <typename A, typename Round>
FSDP_HOST_DEVICE inline AdamElement<A> AdamUpdate(const AdamScalars<A>& s, A p, A g, A m, A v,
                                                  A vmax, Round round) {
  if (s.maximize) g = -g;
  if (s.use_weight_decay) {
    if (s.decoupled) {
      p = round(p * s.decay_factor);
    } else {
      g = round(g + s.weight_decay * p);
    }
  }
  AdamElement<A> out;
  out.exp_avg = round(Lerp(m, g, s.one_minus_beta1));
  A vk = round(v * s.beta2);
  vk = round(vk + s.one_minus_beta2 * g * g);
  out.exp_avg_sq = vk;
  const A v_used = s.amsgrad ? Max(vmax, vk) : vk;
  out.max_exp_avg_sq = v_used;
  A denom = round(Sqrt(v_used));
  denom = round(denom / s.bias_correction2_sqrt);
  denom = round(denom + s.eps);
  out.param = p + s.neg_step_size * out.exp_avg / denom;
  return out;
}

// ---- Element steps on raw storage (the bodies of the CUDA kernels' grid-stride loops) --------

// Element i of `p` (storage dtype t) in the accumulation type, and the store back (rounding
// once to t): exactly cuda_util.cuh's Load<A>/Store<A>, usable on the host too.
template <typename A>
FSDP_HOST_DEVICE inline A LoadAs(const void* p, ElemType t, int64_t i) {
  if constexpr (sizeof(A) == sizeof(double)) {
    return ops::kernels::cuda::LoadDouble(p, t, i);
  } else {
    return ops::kernels::cuda::LoadFloat(p, t, i);
  }
}
template <typename A>
FSDP_HOST_DEVICE inline void StoreAs(void* p, ElemType t, int64_t i, A v) {
  if constexpr (sizeof(A) == sizeof(double)) {
    ops::kernels::cuda::StoreDouble(p, t, i, v);
  } else {
    ops::kernels::cuda::StoreFloat(p, t, i, v);
  }
}

// One SGD element of tensors of storage dtype t; `buf` is null without momentum.
template <typename A>
FSDP_HOST_DEVICE inline void SgdStepAt(const SgdScalars<A>& s, void* param, const void* grad,
                                       void* buf, ElemType t, int64_t i) {
  const A b = buf != nullptr && !s.first_step ? LoadAs<A>(buf, t, i) : A(0);
  const SgdElement<A> e =
      SgdUpdate(s, LoadAs<A>(param, t, i), LoadAs<A>(grad, t, i), b, ElemRounding<A>{t});
  if (buf != nullptr) StoreAs<A>(buf, t, i, e.momentum_buffer);
  StoreAs<A>(param, t, i, e.param);
}

// One Adam(W) element; `vmax` is null without amsgrad.
template <typename A>
FSDP_HOST_DEVICE inline void AdamStepAt(const AdamScalars<A>& s, void* param, const void* grad,
                                        void* m, void* v, void* vmax, ElemType t, int64_t i) {
  const A vmax_i = vmax != nullptr ? LoadAs<A>(vmax, t, i) : A(0);
  const AdamElement<A> e =
      AdamUpdate(s, LoadAs<A>(param, t, i), LoadAs<A>(grad, t, i), LoadAs<A>(m, t, i),
                 LoadAs<A>(v, t, i), vmax_i, ElemRounding<A>{t});
  StoreAs<A>(m, t, i, e.exp_avg);
  StoreAs<A>(v, t, i, e.exp_avg_sq);
  if (vmax != nullptr) StoreAs<A>(vmax, t, i, e.max_exp_avg_sq);
  StoreAs<A>(param, t, i, e.param);
}

}  // namespace fsdp::optim::math
