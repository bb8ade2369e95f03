#include "engine/ops/activation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

namespace {

using internal::HostAs;
using internal::Restore;
using cuda::BinaryOp;

void CheckApproximate(const char* op, const std::string& approximate) {
  FSDP_CHECK(approximate == "none" || approximate == "tanh", op,
             ": approximate must be 'none' or 'tanh', got '", approximate, "'");
}

// out = f(a[i]) or f(a[i], b[i]) elementwise on same-shaped tensors, in compute dtype of `dt`.
// `code` names the same computation for the CUDA kernel.
template <typename F>
Tensor Map2(const char* op, BinaryOp code, const Tensor& a, const Tensor& b, DType dt, F f) {
  FSDP_CHECK(a.sizes() == b.sizes(), op, ": shape mismatch between ", ShapeStr(a.sizes()), " and ",
             ShapeStr(b.sizes()));
  if (internal::OnCuda(op, {&a, &b})) return FSDP_CUDA_KERNEL(op, Binary(op, code, 0.0, a, b, dt));
  const DType cd = internal::ComputeDType(dt);
  const Tensor ha = HostAs(a, cd), hb = HostAs(b, cd);
  Tensor out = internal::DispatchFloat(cd, op, [&](auto tag) {
    using T = decltype(tag);
    Tensor r = Tensor::empty(a.sizes(), cd);
    const T* pa = ha.data<T>();
    const T* pb = hb.data<T>();
    T* po = r.data<T>();
    const int64_t n = r.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    return r;
  });
  return Restore(out, dt, a.device());
}

struct RowLayout {
  int64_t outer;
  int64_t n;
  int64_t inner;
};

RowLayout Layout(const Tensor& x, int64_t dim, const char* op) {
  const int64_t d = internal::WrapDim(dim, x.dim(), op);
  if (x.dim() == 0) return {1, 1, 1};
  return {internal::ProdRange(x.sizes(), 0, d), x.sizes()[static_cast<size_t>(d)],
          internal::ProdRange(x.sizes(), d + 1, x.dim())};
}

// Calls fn(base_offset, stride, n) for every slice along the reduced dimension.
template <typename Fn>
void ForEachSlice(const RowLayout& l, Fn&& fn) {
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) fn(o * l.n * l.inner + i, l.inner, l.n);
  }
}

template <bool kLog>
Tensor SoftmaxImpl(const char* op, const Tensor& x, int64_t dim) {
  internal::CheckFloating(op, "self", x);
  const RowLayout l = Layout(x, dim, op);
  if (internal::OnCuda(op, {&x})) {
    return FSDP_CUDA_KERNEL(op, Softmax(x, internal::WrapDim(dim, x.dim(), op), kLog));
  }
  const DType cd = internal::ComputeDType(x.dtype());
  const Tensor hx = HostAs(x, cd);
  Tensor out = internal::DispatchFloat(cd, op, [&](auto tag) {
    using T = decltype(tag);
    Tensor r = Tensor::empty(x.sizes(), cd);
    const T* px = hx.data<T>();
    T* po = r.data<T>();
    ForEachSlice(l, [&](int64_t base, int64_t stride, int64_t n) {
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, px[base + j * stride]);
      if (std::isinf(mx) && mx < 0) mx = T(0);  // an all -inf row: avoid inf - inf
      T sum = T(0);
      for (int64_t j = 0; j < n; ++j) {
        const T e = std::exp(px[base + j * stride] - mx);
        if constexpr (!kLog) po[base + j * stride] = e;
        sum += e;
      }
      if constexpr (kLog) {
        const T lse = std::log(sum);
        for (int64_t j = 0; j < n; ++j) po[base + j * stride] = px[base + j * stride] - mx - lse;
      } else {
        const T inv = T(1) / sum;
        for (int64_t j = 0; j < n; ++j) po[base + j * stride] *= inv;
      }
    });
    return r;
  });
  return Restore(out, x.dtype(), x.device());
}

template <bool kLog>
Tensor SoftmaxBackwardImpl(const char* op, const Tensor& grad, const Tensor& result, int64_t dim) {
  FSDP_CHECK(grad.sizes() == result.sizes(), op, ": gradient ", ShapeStr(grad.sizes()),
             " does not match output ", ShapeStr(result.sizes()));
  const RowLayout l = Layout(result, dim, op);
  if (internal::OnCuda(op, {&grad, &result})) {
    return FSDP_CUDA_KERNEL(op, SoftmaxBackward(grad, result, internal::WrapDim(dim, result.dim(), op), kLog));
  }
  const DType cd = internal::ComputeDType(result.dtype());
  const Tensor hg = HostAs(grad, cd), hy = HostAs(result, cd);
  Tensor out = internal::DispatchFloat(cd, op, [&](auto tag) {
    using T = decltype(tag);
    Tensor r = Tensor::empty(result.sizes(), cd);
    const T* pg = hg.data<T>();
    const T* py = hy.data<T>();
    T* po = r.data<T>();
    ForEachSlice(l, [&](int64_t base, int64_t stride, int64_t n) {
      T dot = T(0);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = base + j * stride;
        dot += kLog ? pg[k] : pg[k] * py[k];
      }
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = base + j * stride;
        po[k] = kLog ? pg[k] - std::exp(py[k]) * dot : py[k] * (pg[k] - dot);
      }
    });
    return r;
  });
  return Restore(out, result.dtype(), result.device());
}

constexpr double kSqrt1_2 = 0.70710678118654752440;        // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;      // 1/sqrt(2*pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;     // sqrt(2/pi)
constexpr double kKappa = 0.044715;

}  // namespace

Tensor Relu(const Tensor& x) {
  internal::CheckDefined("relu", "self", x);
  FSDP_CHECK(IsFloatingPoint(x.dtype()), "relu: expected a floating-point tensor, got ", x.str());
  return Map2("relu", BinaryOp::kRelu, x, x, x.dtype(), [](auto v, auto) {
    using T = decltype(v);
    return v > T(0) ? v : (std::isnan(v) ? v : T(0));
  });
}

Tensor ReluBackward(const Tensor& grad, const Tensor& result) {
  return Map2("relu_backward", BinaryOp::kReluBackward, grad, result, result.dtype(), [](auto g, auto y) {
    using T = decltype(g);
    return y > T(0) ? g : T(0);
  });
}

Tensor Gelu(const Tensor& x, const std::string& approximate) {
  internal::CheckFloating("gelu", "self", x);
  CheckApproximate("gelu", approximate);
  if (approximate == "tanh") {
    return Map2("gelu", BinaryOp::kGeluTanh, x, x, x.dtype(), [](auto v, auto) {
      using T = decltype(v);
      const T inner = T(kSqrt2OverPi) * (v + T(kKappa) * v * v * v);
      return T(0.5) * v * (T(1) + std::tanh(inner));
    });
  }
  return Map2("gelu", BinaryOp::kGelu, x, x, x.dtype(), [](auto v, auto) {
    using T = decltype(v);
    return v * T(0.5) * (T(1) + std::erf(v * T(kSqrt1_2)));
  });
}

Tensor GeluBackward(const Tensor& grad, const Tensor& x, const std::string& approximate) {
  CheckApproximate("gelu_backward", approximate);
  if (approximate == "tanh") {
    return Map2("gelu_backward", BinaryOp::kGeluTanhBackward, grad, x, x.dtype(), [](auto g, auto v) {
      using T = decltype(g);
      const T x_sq = v * v;
      const T inner = T(kSqrt2OverPi) * (v + T(kKappa) * x_sq * v);
      const T tanh_inner = std::tanh(inner);
      const T left = T(0.5) * v;
      const T right = T(1) + tanh_inner;
      const T left_derivative = T(0.5) * right;
      const T tanh_derivative = T(1) - tanh_inner * tanh_inner;
      const T inner_derivative = T(kSqrt2OverPi) * (T(1) + T(3) * T(kKappa) * x_sq);
      return g * (left_derivative + left * tanh_derivative * inner_derivative);
    });
  }
  return Map2("gelu_backward", BinaryOp::kGeluBackward, grad, x, x.dtype(), [](auto g, auto v) {
    using T = decltype(g);
    const T cdf = T(0.5) * (T(1) + std::erf(v * T(kSqrt1_2)));
    const T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * v * v);
    return g * (cdf + v * pdf);
  });
}

Tensor Softmax(const Tensor& x, int64_t dim) { return SoftmaxImpl<false>("softmax", x, dim); }

Tensor LogSoftmax(const Tensor& x, int64_t dim) { return SoftmaxImpl<true>("log_softmax", x, dim); }

Tensor SoftmaxBackward(const Tensor& grad, const Tensor& result, int64_t dim) {
  return SoftmaxBackwardImpl<false>("softmax_backward", grad, result, dim);
}

Tensor LogSoftmaxBackward(const Tensor& grad, const Tensor& result, int64_t dim) {
  return SoftmaxBackwardImpl<true>("log_softmax_backward", grad, result, dim);
}

}  // namespace fsdp::ops::kernels
