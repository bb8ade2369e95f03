#include "engine/ops/elementwise.h"

#include <cmath>

#include "engine/ops/broadcast.h"
#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

namespace {

using internal::BroadcastStrides;
using internal::ComputeDType;
using internal::ForEachRow;
using internal::HostAs;
using internal::Restore;
using cuda::BinaryOp;
using cuda::UnaryOp;

// out[i] = f(a[i], b[i]) with broadcasting; a and b are CPU tensors of compute dtype `cd`.
template <typename T, typename F>
Tensor BinaryNative(const Tensor& a, const Tensor& b, const Shape& out_shape, F f) {
  Tensor out = Tensor::empty(out_shape, DTypeOf<T>::value);
  T* o = out.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const int64_t n = out.numel();
  if (a.sizes() == out_shape && b.sizes() == out_shape) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(pa[i], pb[i]);
  } else if (a.sizes() == out_shape && b.numel() == 1) {
    const T s = pb[0];
    for (int64_t i = 0; i < n; ++i) o[i] = f(pa[i], s);
  } else if (b.sizes() == out_shape && a.numel() == 1) {
    const T s = pa[0];
    for (int64_t i = 0; i < n; ++i) o[i] = f(s, pb[i]);
  } else {
    std::array<std::vector<int64_t>, 2> strides = {BroadcastStrides(a.sizes(), out_shape),
                                                   BroadcastStrides(b.sizes(), out_shape)};
    ForEachRow<2>(out_shape, strides, [&](int64_t row, const std::array<int64_t, 2>& off, int64_t len,
                                          const std::array<int64_t, 2>& inner) {
      T* orow = o + row * len;
      const T* ar = pa + off[0];
      const T* br = pb + off[1];
      for (int64_t j = 0; j < len; ++j) orow[j] = f(ar[j * inner[0]], br[j * inner[1]]);
    });
  }
  return out;
}

// Binary op with broadcasting computing in ComputeDType(out_dtype); the result has dtype
// `out_dtype` and lives on a's device.
// `code` and `s` (the op's scalar) name the same computation for the CUDA kernel.
template <typename F>
Tensor Binary(const char* op, BinaryOp code, double s, const Tensor& a, const Tensor& b, DType out_dtype,
              bool allow_int, F f) {
  internal::CheckDefined(op, "self", a);
  internal::CheckDefined(op, "other", b);
  FSDP_CHECK(allow_int || IsFloatingPoint(out_dtype), op, ": int64 inputs are not supported, got ",
             a.str(), " and ", b.str());
  if (internal::OnCuda(op, {&a, &b}, /*allow_cpu_scalars=*/true)) {
    return FSDP_CUDA_KERNEL(op, Binary(op, code, s, a, b, out_dtype));
  }
  FSDP_CHECK(a.device() == b.device() || a.dim() == 0 || b.dim() == 0, op,
             ": expected all tensors to be on the same device, got ", a.str(), " and ", b.str());
  const Shape out_shape = BroadcastShapes(a.sizes(), b.sizes(), op);
  const DType cd = ComputeDType(out_dtype);
  const Tensor ha = HostAs(a, cd), hb = HostAs(b, cd);
  const Device device = a.dim() == 0 && b.dim() != 0 ? b.device() : a.device();
  Tensor out = internal::DispatchNumeric(cd, op, [&](auto tag) {
    using T = decltype(tag);
    return BinaryNative<T>(ha, hb, out_shape, [&](T x, T y) { return f(x, y); });
  });
  return Restore(out, out_dtype, device);
}

template <typename F>
Tensor Unary(const char* op, UnaryOp code, double s, const Tensor& x, DType out_dtype, F f) {
  internal::CheckDefined(op, "self", x);
  if (internal::OnCuda(op, {&x})) return FSDP_CUDA_KERNEL(op, Unary(op, code, s, x, out_dtype));
  const DType cd = ComputeDType(out_dtype);
  const Tensor hx = HostAs(x, cd);
  Tensor out = internal::DispatchNumeric(cd, op, [&](auto tag) {
    using T = decltype(tag);
    Tensor r = Tensor::empty(x.sizes(), cd);
    const T* px = hx.data<T>();
    T* o = r.data<T>();
    const int64_t n = r.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = f(px[i]);
    return r;
  });
  return Restore(out, out_dtype, x.device());
}

// Floating-point unary ops promote int64 inputs to float32 (like torch.exp on a LongTensor).
DType FloatResult(const Tensor& x) { return IsFloatingPoint(x.dtype()) ? x.dtype() : DType::kFloat32; }

bool IsIntegral(double s) { return s == static_cast<double>(static_cast<int64_t>(s)); }

Tensor CastTo(const Tensor& t, const Tensor& like) {
  return t.defined() ? Restore(t, like.dtype(), like.device()) : t;
}

// Reduces a broadcast gradient to the shape and dtype of `input`.
Tensor ReduceGrad(const Tensor& g, const Tensor& input) { return CastTo(SumToShape(g, input.sizes()), input); }

}  // namespace

// ---- Binary ----------------------------------------------------------------------------------

Tensor Add(const Tensor& a, const Tensor& b, double alpha) {
  const DType dt = ResultType(a, b);
  FSDP_CHECK(IsFloatingPoint(dt) || IsIntegral(alpha), "add: alpha ", alpha,
             " must be integral for int64 inputs");
  if (alpha == 1.0) return Binary("add", BinaryOp::kAdd, 1.0, a, b, dt, true, [](auto x, auto y) { return x + y; });
  return Binary("add", BinaryOp::kAdd, alpha, a, b, dt, true, [alpha](auto x, auto y) {
    using T = decltype(x);
    return x + static_cast<T>(alpha) * y;
  });
}

Tensor Sub(const Tensor& a, const Tensor& b, double alpha) {
  const DType dt = ResultType(a, b);
  FSDP_CHECK(IsFloatingPoint(dt) || IsIntegral(alpha), "sub: alpha ", alpha,
             " must be integral for int64 inputs");
  if (alpha == 1.0) return Binary("sub", BinaryOp::kSub, 1.0, a, b, dt, true, [](auto x, auto y) { return x - y; });
  return Binary("sub", BinaryOp::kSub, alpha, a, b, dt, true, [alpha](auto x, auto y) {
    using T = decltype(x);
    return x - static_cast<T>(alpha) * y;
  });
}

Tensor Mul(const Tensor& a, const Tensor& b) {
  return Binary("mul", BinaryOp::kMul, 1.0, a, b, ResultType(a, b), true, [](auto x, auto y) { return x * y; });
}

Tensor Div(const Tensor& a, const Tensor& b) {
  DType dt = ResultType(a, b);
  if (!IsFloatingPoint(dt)) dt = DType::kFloat32;
  return Binary("div", BinaryOp::kDiv, 1.0, a, b, dt, false, [](auto x, auto y) { return x / y; });
}

BinaryGrads AddBackward(const Tensor& grad, const Tensor& a, const Tensor& b, double alpha,
                        bool need_a, bool need_b) {
  BinaryGrads g;
  if (need_a) g.a = ReduceGrad(grad, a);
  if (need_b) g.b = ReduceGrad(alpha == 1.0 ? grad : MulScalar(grad, alpha), b);
  return g;
}

BinaryGrads SubBackward(const Tensor& grad, const Tensor& a, const Tensor& b, double alpha,
                        bool need_a, bool need_b) {
  BinaryGrads g;
  if (need_a) g.a = ReduceGrad(grad, a);
  if (need_b) g.b = ReduceGrad(MulScalar(grad, -alpha), b);
  return g;
}

BinaryGrads MulBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a, bool need_b) {
  BinaryGrads g;
  if (need_a) g.a = ReduceGrad(Mul(grad, b), a);
  if (need_b) g.b = ReduceGrad(Mul(grad, a), b);
  return g;
}

BinaryGrads DivBackward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a, bool need_b) {
  BinaryGrads g;
  if (need_a) g.a = ReduceGrad(Div(grad, b), a);
  if (need_b) g.b = ReduceGrad(Neg(Mul(grad, Div(Div(a, b), b))), b);
  return g;
}

// ---- Scalar ----------------------------------------------------------------------------------

Tensor AddScalar(const Tensor& x, double s) {
  internal::CheckDefined("add", "self", x);
  return Unary("add", UnaryOp::kAddScalar, s, x, ResultTypeWithScalar(x, s), [s](auto v) {
    using T = decltype(v);
    return v + static_cast<T>(s);
  });
}

Tensor MulScalar(const Tensor& x, double s) {
  internal::CheckDefined("mul", "self", x);
  return Unary("mul", UnaryOp::kMulScalar, s, x, ResultTypeWithScalar(x, s), [s](auto v) {
    using T = decltype(v);
    return v * static_cast<T>(s);
  });
}

Tensor DivScalar(const Tensor& x, double s) {
  internal::CheckDefined("div", "self", x);
  DType dt = ResultTypeWithScalar(x, s);
  if (!IsFloatingPoint(dt)) dt = DType::kFloat32;
  return Unary("div", UnaryOp::kDivScalar, s, x, dt, [s](auto v) {
    using T = decltype(v);
    return v / static_cast<T>(s);
  });
}

Tensor RSubScalar(const Tensor& x, double s) {
  internal::CheckDefined("rsub", "self", x);
  return Unary("rsub", UnaryOp::kRSubScalar, s, x, ResultTypeWithScalar(x, s), [s](auto v) {
    using T = decltype(v);
    return static_cast<T>(s) - v;
  });
}

namespace {

template <typename T>
T PowValue(T x, double e) {
  if (e == 2.0) return x * x;
  if (e == 3.0) return x * x * x;
  if (e == 1.0) return x;
  if (e == 0.5) return std::sqrt(x);
  if (e == -0.5) return T(1) / std::sqrt(x);
  if (e == -1.0) return T(1) / x;
  if (e == -2.0) return T(1) / (x * x);
  return std::pow(x, static_cast<T>(e));
}

}  // namespace

Tensor PowScalar(const Tensor& x, double exponent) {
  internal::CheckFloating("pow", "self", x);
  return Unary("pow", UnaryOp::kPow, exponent, x, x.dtype(), [exponent](auto v) { return PowValue(v, exponent); });
}

Tensor PowScalarBackward(const Tensor& grad, const Tensor& x, double exponent) {
  if (exponent == 0.0) return Tensor::zeros(x.sizes(), x.dtype(), x.device());
  const DType dt = PromoteTypes(grad.dtype(), x.dtype());
  Tensor out = Binary("pow_backward", BinaryOp::kPowBackward, exponent, grad, x, dt, false, [exponent](auto g, auto v) {
    using T = decltype(g);
    return g * (static_cast<T>(exponent) * PowValue(v, exponent - 1.0));
  });
  return CastTo(out, x);
}

// ---- Unary -----------------------------------------------------------------------------------

Tensor Neg(const Tensor& x) { return Unary("neg", UnaryOp::kNeg, 0.0, x, x.dtype(), [](auto v) { return -v; }); }

Tensor Exp(const Tensor& x) {
  return Unary("exp", UnaryOp::kExp, 0.0, x, FloatResult(x), [](auto v) { return std::exp(v); });
}

Tensor Log(const Tensor& x) {
  return Unary("log", UnaryOp::kLog, 0.0, x, FloatResult(x), [](auto v) { return std::log(v); });
}

Tensor Sqrt(const Tensor& x) {
  return Unary("sqrt", UnaryOp::kSqrt, 0.0, x, FloatResult(x), [](auto v) { return std::sqrt(v); });
}

Tensor Rsqrt(const Tensor& x) {
  return Unary("rsqrt", UnaryOp::kRsqrt, 0.0, x, FloatResult(x), [](auto v) {
    using T = decltype(v);
    return T(1) / std::sqrt(v);
  });
}

Tensor Reciprocal(const Tensor& x) {
  return Unary("reciprocal", UnaryOp::kReciprocal, 0.0, x, FloatResult(x), [](auto v) {
    using T = decltype(v);
    return T(1) / v;
  });
}

Tensor ExpBackward(const Tensor& grad, const Tensor& result) { return CastTo(Mul(grad, result), result); }

Tensor LogBackward(const Tensor& grad, const Tensor& x) { return CastTo(Div(grad, x), x); }

Tensor SqrtBackward(const Tensor& grad, const Tensor& result) {
  const DType dt = PromoteTypes(grad.dtype(), result.dtype());
  return CastTo(Binary("sqrt_backward", BinaryOp::kSqrtBackward, 0.0, grad, result, dt, false, [](auto g, auto r) {
                  using T = decltype(g);
                  return g / (T(2) * r);
                }),
                result);
}

Tensor RsqrtBackward(const Tensor& grad, const Tensor& result) {
  const DType dt = PromoteTypes(grad.dtype(), result.dtype());
  return CastTo(Binary("rsqrt_backward", BinaryOp::kRsqrtBackward, 0.0, grad, result, dt, false, [](auto g, auto r) {
                  using T = decltype(g);
                  return T(-0.5) * g * (r * r * r);
                }),
                result);
}

Tensor ReciprocalBackward(const Tensor& grad, const Tensor& result) {
  const DType dt = PromoteTypes(grad.dtype(), result.dtype());
  return CastTo(Binary("reciprocal_backward", BinaryOp::kReciprocalBackward, 0.0, grad, result, dt, false, [](auto g, auto r) { return -g * (r * r); }),
                result);
}

}  // namespace fsdp::ops::kernels
